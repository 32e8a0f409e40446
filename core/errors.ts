/**
 * Typed errors. Every error the service raises on purpose is a {@link ServiceError}: it
 * carries a machine `code`, the HTTP `status` it maps to, and structured fields (`issues`
 * per bad field, `reasons` per backend) that the server turns into an RFC 9457 problem.
 * @module
 */

/** One bad field: a path into the request (zod-style) and what is wrong, with the current value. */
export interface Issue {
  path: (string | number)[];
  message: string;
}

/** Options of a {@link ServiceError}. */
export interface ServiceErrorInit {
  status: number;
  code: string;
  title?: string;
  issues?: Issue[];
  reasons?: Record<string, string[]>;
  /** Any other structured fields to put in the problem document. */
  extra?: Record<string, unknown>;
}

/** An error with a code, an HTTP status and structured detail. */
export class ServiceError extends Error {
  readonly status: number;
  readonly code: string;
  readonly title: string;
  readonly issues?: Issue[];
  readonly reasons?: Record<string, string[]>;
  readonly extra?: Record<string, unknown>;
  constructor(message: string, init: ServiceErrorInit) {
    super(message);
    this.name = "ServiceError";
    this.status = init.status;
    this.code = init.code;
    this.title = init.title ?? defaultTitle(init.status);
    this.issues = init.issues;
    this.reasons = init.reasons;
    this.extra = init.extra;
  }
}

function defaultTitle(status: number): string {
  switch (status) {
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 503:
      return "Service Unavailable";
    default:
      return status >= 500 ? "Internal Server Error" : "Error";
  }
}

/**
 * Most issues one problem lists: a body may hold millions of defects (a 4,000,000-key JSON body
 * made a 254 MB answer before schema problems were capped), so the rest are counted in one more
 * issue ({@link withNotListed}). Validation, schema checks and safetensors parsing share it.
 */
export const MAX_LISTED_ISSUES = 100;

/** `listed`, then (where `dropped` > 0) one issue at path `[]` counting those not listed. */
export function withNotListed(listed: Issue[], dropped: number): Issue[] {
  return dropped > 0
    ? [...listed, { path: [], message: `${dropped} more issues not listed` }]
    : listed;
}

/**
 * A request that parses but cannot run (shapes disagree, ids out of range): 422 `invalid_batch`.
 * `extra`: further problem fields (the `limit`, `value`, `max` of a per-call limit it exceeds too).
 */
export function invalidBatch(issues: Issue[], extra?: Record<string, unknown>): ServiceError {
  const first = issues[0];
  const where = first ? `${first.path.join(".") || "(body)"}: ${first.message}` : "invalid batch";
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
  return new ServiceError(`${where}${more}`, {
    status: 422,
    code: "invalid_batch",
    issues,
    ...(extra ? { extra } : {}),
  });
}

/** A call reached a KV cache (host or GPU) after its destroy(): 409 `cache_destroyed`. */
export function cacheDestroyed(): ServiceError {
  return new ServiceError("the KV cache was destroyed", { status: 409, code: "cache_destroyed" });
}

/** No backend can run this configuration: 422 `no_valid_backend` with every backend's reasons. */
export class NoValidBackendError extends ServiceError {
  constructor(reasons: Record<string, string[]>, forced?: string) {
    const list = Object.entries(reasons).map(([n, r]) => `${n}: [${r.join(", ")}]`).join("; ");
    const own = forced ? `[${(reasons[forced] ?? []).join(", ")}]` : "";
    super(
      forced
        ? `backend ${forced} cannot run this configuration: ${own}. Reasons: {${list}}`
        : `no valid attention backend for this configuration. Reasons: {${list}}`,
      { status: 422, code: "no_valid_backend", reasons },
    );
    this.name = "NoValidBackendError";
  }
}

/** A WGSL shader or pipeline failed to compile: carries the compiler's messages. */
export class ShaderCompileError extends ServiceError {
  readonly key: string;
  readonly messages: string[];
  constructor(key: string, messages: string[]) {
    super(`pipeline ${key} failed to compile: ${messages.join("; ")}`, {
      status: 500,
      code: "shader_compile_failed",
      extra: { pipeline: key },
    });
    this.name = "ShaderCompileError";
    this.key = key;
    this.messages = messages;
  }
}

/**
 * The device is missing or was lost: 503. `permanent`: the service has no device by its
 * configuration (`--no-gpu`) and never will, so retrying cannot help: the problem says so
 * (`retryable: false`), and the server sends it without `Retry-After` and does not log it as a
 * service error (server/problem.ts).
 */
export class DeviceUnavailableError extends ServiceError {
  constructor(message: string, opts: { permanent?: boolean } = {}) {
    super(message, {
      status: 503,
      code: "device_unavailable",
      ...(opts.permanent ? { extra: { retryable: false } } : {}),
    });
    this.name = "DeviceUnavailableError";
  }
}

/** Whether an error (or its plain form) is a 503 that retrying cannot help (`retryable: false`). */
export function isPermanentUnavailable(
  e: { status: number; extra?: Record<string, unknown> },
): boolean {
  return e.status === 503 && e.extra?.retryable === false;
}

/** The problem code of a call that waited past its queue timeout and did not run. */
export const QUEUE_TIMEOUT_CODE = "queue_timeout";

/**
 * A call that waited longer than its queue timeout (the caller's bound on the time from its
 * arrival, body read, to its start: behind earlier calls on its cache, for the device) and was
 * not run: nothing was written, so the caller may retry it or give up knowing it had no effect.
 * 503, `retryable: true` with `Retry-After: 0` (the wait was the caller's choice, not an
 * outage), and not logged as a fault (the server is busy, not broken; the metrics count it
 * with the route's other 503s).
 */
export class QueueTimeoutError extends ServiceError {
  constructor(timeoutMs: number, waitedMs: number) {
    super(
      `the call waited ${waitedMs.toFixed(1)} ms to start, past its queue timeout of ` +
        `${timeoutMs} ms, and did not run: nothing was written`,
      {
        status: 503,
        code: QUEUE_TIMEOUT_CODE,
        extra: {
          queue_timeout_ms: timeoutMs,
          waited_ms: Math.round(waitedMs * 1000) / 1000,
          retryable: true,
          retry_after_s: 0,
        },
      },
    );
    this.name = "QueueTimeoutError";
  }
}

/**
 * Whether a 5xx error (or its plain form) is no fault of the server, so it is not logged as one:
 * a 503 that retrying cannot help (no device by configuration) or a queue timeout.
 */
export function isExpectedUnavailable(
  e: { status: number; code?: string; extra?: Record<string, unknown> },
): boolean {
  return isPermanentUnavailable(e) || (e.status === 503 && e.code === QUEUE_TIMEOUT_CODE);
}

/**
 * The client went away (closed its connection or aborted) before the call ran: nothing was
 * written. Status 499 (nginx's "client closed request"); nobody reads the answer, but logs and
 * metrics count it apart from server errors.
 */
export class ClientClosedError extends ServiceError {
  constructor(message: string) {
    super(message, { status: 499, code: "client_closed_request", title: "Client Closed Request" });
    this.name = "ClientClosedError";
  }
}

/** An error as plain, structured-cloneable data (across a worker boundary). */
export interface PlainError {
  name: string;
  message: string;
  service?: ServiceErrorInit;
}

/** Any thrown value as a {@link PlainError}. */
export function errorToPlain(e: unknown): PlainError {
  if (e instanceof ServiceError) {
    const { status, code, title, issues, reasons, extra } = e;
    return {
      name: e.name,
      message: e.message,
      service: { status, code, title, issues, reasons, extra },
    };
  }
  if (e instanceof Error) return { name: e.name, message: e.message };
  return { name: "Error", message: String(e) };
}

/** The error a {@link PlainError} stands for: the same ServiceError, or a plain Error. */
export function errorFromPlain(p: PlainError): Error {
  if (p.service) {
    const e = new ServiceError(p.message, p.service);
    e.name = p.name;
    return e;
  }
  const e = new Error(p.message);
  e.name = p.name;
  return e;
}
