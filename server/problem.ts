/**
 * RFC 9457 problem documents (`application/problem+json`): every error response. A
 * ServiceError maps to its status and code with its `issues` / `reasons`; a ZodError becomes
 * a 400 whose issues name each field and its current value; anything else is a 500 with a
 * generic detail (the error itself is logged server-side, never sent: no stack traces).
 * Every 503 carries `Retry-After`; a {@link ProblemError} may carry other response headers
 * (`WWW-Authenticate` on a 401).
 * @module
 */
import type { z } from "zod";
import { type Issue, ServiceError } from "../core/errors.ts";

/** The problem media type. */
export const PROBLEM_CONTENT_TYPE = "application/problem+json";

/** An RFC 9457 problem document with this service's extension fields. */
export interface ProblemDocument {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
  instance?: string;
  issues?: Issue[];
  reasons?: Record<string, string[]>;
  [extra: string]: unknown;
}

/** The problem type URI of a code. */
export function problemType(code: string): string {
  return `urn:attn-service:problem:${code}`;
}

/** A short JSON rendering of a value for messages. */
export function showValue(v: unknown, max = 80): string {
  if (v === undefined) return "undefined (missing)";
  let s: string;
  try {
    s = JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x)) ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > max ? s.slice(0, max - 3) + "..." : s;
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let v: unknown = root;
  for (const k of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  return v;
}

type ZIssue = z.core.$ZodIssue;

/** Picks the union branch that got furthest (longest issue paths, not a type mismatch at the root). */
function bestBranch(errors: ZIssue[][], depth: number): ZIssue[] {
  let best = errors[0] ?? [];
  let score = -1;
  for (const branch of errors) {
    const s = Math.max(
      ...branch.map((i) =>
        i.path.length > depth || i.code !== "invalid_type" ? 10 + i.path.length : 0
      ),
    );
    if (s > score) {
      score = s;
      best = branch;
    }
  }
  return best;
}

function flattenIssues(
  issues: readonly ZIssue[],
  base: PropertyKey[],
  root: unknown,
  out: Issue[],
): void {
  for (const i of issues) {
    const path = [...base, ...i.path];
    if (i.code === "invalid_union" && i.errors.length > 0) {
      flattenIssues(bestBranch(i.errors, 0), path, root, out);
      continue;
    }
    if (i.code === "unrecognized_keys") {
      for (const k of i.keys) {
        out.push({
          path: [...path, k].map(String),
          message: `unknown field ${JSON.stringify(k)}; got ${
            showValue(valueAt(root, [...path, k]))
          }`,
        });
      }
      continue;
    }
    out.push({
      path: path.map((p) => (typeof p === "number" ? p : String(p))),
      message: `${i.message}; got ${showValue(valueAt(root, path))}`,
    });
  }
}

/** zod issues → `{path, message}` issues whose messages carry the current value. */
export function zodIssues(
  error: z.ZodError,
  input: unknown,
  prefix: (string | number)[] = [],
): Issue[] {
  const out: Issue[] = [];
  flattenIssues(error.issues, prefix, input, out);
  return out;
}

/** A ZodError as a 400 ServiceError (`invalid_request` unless another code is given). */
export function fromZod(
  error: z.ZodError,
  input: unknown,
  opts: { code?: string; prefix?: (string | number)[]; what?: string } = {},
): ServiceError {
  const issues = zodIssues(error, input, opts.prefix);
  const first = issues[0];
  const where = first ? `${first.path.join(".") || "(body)"}: ${first.message}` : "invalid";
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
  return new ServiceError(
    `${opts.what ?? "request body"} does not match the schema: ${where}${more}`,
    {
      status: 400,
      code: opts.code ?? "invalid_request",
      issues,
    },
  );
}

/** Logs unexpected errors (replaceable in tests). */
export type ErrorLogger = (message: string, error: unknown) => void;

const defaultLogger: ErrorLogger = (message, error) => console.error(message, error);

/**
 * Any thrown value → a problem document. Non-ServiceErrors become a generic 500 and are logged.
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
    if (err.status >= 500) log(`service error on ${instance ?? "?"}`, err);
    return doc;
  }
  const id = crypto.randomUUID();
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

/** The response headers an error asks for (none for most). */
export function errorHeaders(err: unknown): Record<string, string> {
  return err instanceof ProblemError ? err.headers : {};
}

/**
 * A problem document as a Response. A 503 gets `Retry-After` (the document's `retry_after_s`
 * when it has one, else {@link RETRY_AFTER_SECONDS}) unless `headers` already has one.
 */
export function problemResponse(doc: ProblemDocument, headers?: HeadersInit): Response {
  const h = new Headers(headers);
  h.set("content-type", PROBLEM_CONTENT_TYPE);
  if (doc.status === 503 && !h.has("retry-after")) {
    const s = doc.retry_after_s;
    h.set(
      "retry-after",
      String(typeof s === "number" && Number.isSafeInteger(s) && s >= 0 ? s : RETRY_AFTER_SECONDS),
    );
  }
  return new Response(JSON.stringify(doc), { status: doc.status, headers: h });
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
