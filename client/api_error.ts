/**
 * The client's errors: {@link AttentionApiError}, made from any error answer ({@link problemOf}:
 * the server's RFC 9457 problem document, or one built around a body that is not one), with the
 * answer's `Retry-After` in seconds ({@link retryAfterOf}); and the client's own, each with the
 * original error as `cause`: `network_error` (status 0: no answer, or its body broke off;
 * {@link networkError}) and `bad_response` (a successful answer the client cannot decode, e.g.
 * a proxy's HTML page; {@link badResponse}).
 * @module
 */
import { INSTANCE_HEADER } from "../wire/names.ts";
import type { ProblemDocument } from "../wire/types.ts";

/**
 * A failed call: the HTTP status and the problem document (a body that is no problem document,
 * e.g. a proxy's page, becomes one with code `http_error` and the body as `detail`). The client
 * makes two codes of its own: `network_error` (status 0) and `bad_response` (the answer's
 * status), with the error behind them as `cause`.
 */
export class AttentionApiError extends Error {
  readonly status: number;
  readonly problem: ProblemDocument;
  /** The instance that answered (`X-Attention-Instance`), when it named itself. */
  readonly instance?: string;
  /** Seconds the server asks to wait before a retry (`Retry-After`, on 503s), when it says. */
  readonly retryAfter?: number;
  constructor(
    status: number,
    problem: ProblemDocument,
    instance?: string,
    retryAfter?: number,
    options?: ErrorOptions,
  ) {
    super(
      `${status} ${problem.code}: ${problem.detail ?? problem.title ?? "request failed"}`,
      options,
    );
    this.name = "AttentionApiError";
    this.status = status;
    this.problem = problem;
    if (instance !== undefined) this.instance = instance;
    if (retryAfter !== undefined) this.retryAfter = retryAfter;
  }
  /** The problem's machine code. */
  get code(): string {
    return this.problem.code;
  }
}

const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e));

/**
 * A call that got no answer (the fetch failed: refused, reset, DNS, TLS) or lost it mid-body:
 * status 0, code `network_error`, `cause` the fetch's error.
 */
export function networkError(e: unknown, what: string): AttentionApiError {
  return new AttentionApiError(
    0,
    {
      type: "urn:attn-service:problem:network_error",
      title: "Network Error",
      status: 0,
      detail: `${what}: ${messageOf(e)}`,
      code: "network_error",
    },
    undefined,
    undefined,
    { cause: e },
  );
}

/**
 * A successful answer whose body is not what the route answers (not JSON, not a safetensors
 * file): the answer's status, code `bad_response`, `cause` the decoder's error.
 */
export function badResponse(res: Response, e: unknown): AttentionApiError {
  return new AttentionApiError(
    res.status,
    {
      type: "urn:attn-service:problem:bad_response",
      title: "Bad Response",
      status: res.status,
      detail: `the ${res.status} answer could not be decoded: ${messageOf(e)}`,
      code: "bad_response",
    },
    res.headers.get(INSTANCE_HEADER) ?? undefined,
    undefined,
    { cause: e },
  );
}

/** An error answer's problem document, whatever the body held. */
export function problemOf(res: Response, text: string): ProblemDocument {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch { /* not JSON */ }
  if (typeof doc === "object" && doc !== null && !Array.isArray(doc)) {
    const p = doc as Record<string, unknown>;
    // This service's problems carry a `code`; another's (RFC 9457: a proxy's, a gateway's) keep
    // their type, title and detail under `http_error`. The status is the answer's own.
    const rfc = ["type", "title", "detail"].some((k) => typeof p[k] === "string");
    if (
      typeof p.code === "string" || (rfc && res.headers.get("content-type")?.includes("problem"))
    ) {
      return {
        ...p,
        type: typeof p.type === "string" ? p.type : "about:blank",
        title: typeof p.title === "string" ? p.title : res.statusText,
        code: typeof p.code === "string" ? p.code : "http_error",
        status: res.status,
      } as ProblemDocument;
    }
  }
  return {
    type: "about:blank",
    title: res.statusText,
    status: res.status,
    detail: text.length > 500 ? `${text.slice(0, 497)}...` : text,
    code: "http_error",
  };
}

/** `Retry-After` in seconds (a delay, or an HTTP date from now), when present and valid. */
export function retryAfterOf(res: Response): number | undefined {
  const h = res.headers.get("retry-after");
  if (h === null) return undefined;
  if (/^\d+$/.test(h.trim())) return Number(h.trim());
  // Else an HTTP date (RFC 9110: IMF-fixdate, RFC 850 or asctime; a weekday and a month name),
  // not whatever Date.parse makes of "1.5" or "-5" (a year: "retry now").
  if (!/^[A-Za-z]{3,9},? .*[A-Za-z]{3}.*\d{2}:\d{2}:\d{2}/.test(h.trim())) return undefined;
  const at = Date.parse(h);
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - Date.now()) / 1000));
}
