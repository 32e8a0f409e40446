/**
 * RFC 9457 problem documents (`application/problem+json`, shaped by wire/schemas.ts's
 * ProblemSchema): every error response. A ServiceError maps to its status and code with its
 * `issues` / `reasons` (a ZodError becomes one through wire/zod_issues.ts); anything else is a
 * 500 with a generic detail (the error itself is logged server-side, never sent: no stack traces).
 * Every 503 carries `Retry-After`, but one that says retrying cannot help (`retryable: false`:
 * a forced GPU backend on a server with no device by configuration); a {@link ProblemError} may
 * carry other response headers (`WWW-Authenticate` on a 401).
 * @module
 */
import { EnvValueError } from "../core/env.ts";
import { isExpectedUnavailable, ServiceError } from "../core/errors.ts";
import type { ProblemDocument } from "../wire/types.ts";

/** The problem media type. */
export const PROBLEM_CONTENT_TYPE = "application/problem+json";

/** The problem type URI of a code. */
export function problemType(code: string): string {
  return `urn:attn-service:problem:${code}`;
}

/** Logs unexpected errors (replaceable in tests). */
export type ErrorLogger = (message: string, error: unknown) => void;

/** A logger for answers that are expected and not logged; such problems carry no `error_id`. */
export const NOT_LOGGED: ErrorLogger = () => {};

/** Text on one line: its lines joined with " | " (one log line an error). */
export function joinLines(text: string): string {
  return text.split("\n").map((l) => l.trim()).filter((l) => l).join(" | ");
}

/**
 * An error on one line: its stack (or name and message), then each `cause` in turn; a thrown
 * value that is not an Error as Deno prints it.
 */
export function oneLine(error: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = error, depth = 0; e !== undefined && depth < 8; depth++) {
    if (e instanceof Error) {
      parts.push(e.stack ?? `${e.name}: ${e.message}`);
      e = e.cause;
    } else {
      parts.push(typeof e === "string" ? e : Deno.inspect(e, { compact: true, depth: 4 }));
      e = undefined;
    }
    if (depth > 0) parts[parts.length - 1] = `caused by ${parts[parts.length - 1]}`;
  }
  return joinLines(parts.join("\n"));
}

/**
 * Logs each error as one line to stderr, after `prefix` (e.g. "device thread 1: "): the message
 * (its own lines joined, as a GPU validation message has several), then the error on the same
 * line, unless it is a ServiceError other than a 500 (an expected refusal, whose message the
 * caller's already holds: no stack).
 */
export function lineLogger(prefix = ""): ErrorLogger {
  return (message, error) => {
    const quiet = error === undefined ||
      (error instanceof ServiceError && error.status !== 500);
    console.error(prefix + joinLines(quiet ? message : `${message}: ${oneLine(error)}`));
  };
}

const defaultLogger: ErrorLogger = lineLogger();

/**
 * Any thrown value → a problem document. Non-ServiceErrors become a generic 500 and are logged;
 * so are 5xx ServiceErrors, but a 503 that retrying cannot help (the server's configuration, not
 * a fault: `retryable: false`), answered like a 4xx.
 */
export function toProblem(
  err: unknown,
  instance?: string,
  log: ErrorLogger = defaultLogger,
): ProblemDocument {
  if (err instanceof ServiceError) {
    const doc: ProblemDocument = {
      type: problemType(err.code),
      title: err.title,
      status: err.status,
      detail: err.message,
      code: err.code,
    };
    if (instance) doc.instance = instance;
    if (err.issues) doc.issues = err.issues;
    if (err.reasons) doc.reasons = err.reasons;
    for (const [k, v] of Object.entries(err.extra ?? {})) if (!(k in doc)) doc[k] = v;
    if (err.status >= 500 && log !== NOT_LOGGED && !isExpectedUnavailable(err)) {
      // One line; the id ties the answer to it.
      const id = crypto.randomUUID();
      doc.error_id = id;
      log(
        `service error ${id} on ${instance ?? "?"}: ${err.status} ${err.code}: ${err.message}`,
        err,
      );
    }
    return doc;
  }
  const id = crypto.randomUUID();
  if (err instanceof EnvValueError) {
    // The operator's mistake, not the client's: named, the value only in the log.
    log(`configuration error ${id} on ${instance ?? "?"}: ${err.message}`, err);
    return {
      type: problemType("server_misconfigured"),
      title: "Internal Server Error",
      status: 500,
      detail: `the server's environment variable ${err.variable} holds a value its rule refuses ` +
        `(error id ${id}; the server log says which and why)`,
      code: "server_misconfigured",
      variable: err.variable,
      error_id: id,
      ...(instance ? { instance } : {}),
    };
  }
  log(`unexpected error ${id} on ${instance ?? "?"}`, err);
  return {
    type: problemType("internal_error"),
    title: "Internal Server Error",
    status: 500,
    detail: `an unexpected error occurred (error id ${id}); see the server log`,
    code: "internal_error",
    ...(instance ? { instance } : {}),
  };
}

/** Seconds a 503 answer asks the client to wait (`Retry-After`), unless the error says. */
export const RETRY_AFTER_SECONDS = 5;

/** A ServiceError raised by the HTTP layer that also sets response headers. */
export class ProblemError extends ServiceError {
  readonly headers: Record<string, string>;
  constructor(
    message: string,
    init: ConstructorParameters<typeof ServiceError>[1] & { headers?: Record<string, string> },
  ) {
    super(message, init);
    this.name = "ProblemError";
    this.headers = init.headers ?? {};
  }
}

const addedHeaders = new WeakMap<object, Record<string, string>>();

/**
 * Adds response headers to any thrown value on its way out of a route (the forward routes'
 * `Server-Timing`), without changing what it is; returns it for `throw`.
 */
export function withErrorHeaders(err: unknown, headers: Record<string, string>): unknown {
  if (typeof err === "object" && err !== null) {
    addedHeaders.set(err, { ...addedHeaders.get(err), ...headers });
  }
  return err;
}

/** The response headers an error asks for (none for most), with those added on the way. */
export function errorHeaders(err: unknown): Record<string, string> {
  const own = err instanceof ProblemError ? err.headers : {};
  const added = typeof err === "object" && err !== null ? addedHeaders.get(err) : undefined;
  return added ? { ...own, ...added } : own;
}

const problemCodes = new WeakMap<Response, string>();

/** The problem code of a response {@link problemResponse} built, else undefined. */
export function problemCodeOf(res: Response): string | undefined {
  return problemCodes.get(res);
}

/**
 * A problem document as a Response. A 503 gets `Retry-After` (the document's `retry_after_s`
 * when it has one, else {@link RETRY_AFTER_SECONDS}) unless `headers` already has one, or the
 * document says retrying cannot help (`retryable: false`).
 */
export function problemResponse(doc: ProblemDocument, headers?: HeadersInit): Response {
  const h = new Headers(headers);
  h.set("content-type", PROBLEM_CONTENT_TYPE);
  // A body that stopped coming: the connection is not reused (README, Reliability).
  if (doc.code === "body_timeout") h.set("connection", "close");
  if (doc.status === 503 && doc.retryable !== false && !h.has("retry-after")) {
    const s = doc.retry_after_s;
    h.set(
      "retry-after",
      String(typeof s === "number" && Number.isSafeInteger(s) && s >= 0 ? s : RETRY_AFTER_SECONDS),
    );
  }
  const res = new Response(JSON.stringify(doc), { status: doc.status, headers: h });
  problemCodes.set(res, doc.code);
  return res;
}

/** Shorthand: a ServiceError with status and code (and response headers, title). */
export function problem(
  status: number,
  code: string,
  detail: string,
  extra?: Record<string, unknown>,
  opts: { headers?: Record<string, string>; title?: string } = {},
): ServiceError {
  return new ProblemError(detail, { status, code, extra, ...opts });
}
