/**
 * The answers the service's own HTTP/1.1 server (http1_server.ts) gives itself, before any
 * handler sees a request: a refused head's problem (http1_head.ts, and a method not served), the
 * head timeout's 408 and the 503 of a connection over the cap, each followed by a lingering close.
 * Each is counted where the handler counts its answers ({@link RequestCounts}: metrics.ts
 * `attn_http_requests_total` and `attn_http_problems_total`, or the device threads' front's own
 * counts), with the labels the handler gives an answer it matched no route for: route
 * `unmatched`, the method the head began with (`other` when none came or it is not a known one:
 * metrics.ts methodLabel), the status and the problem's code. Counted when the answer is given,
 * whether or not the client reads it, as the handler counts.
 * @module
 */
import { problemResponse, problemType } from "./problem.ts";
import type { Metrics } from "./metrics.ts";
import { type HeadProblem, isoLatin1, MAX_HEAD_BYTES } from "./http1_head.ts";
import { ConnReader } from "./http1_reader.ts";
import { writeResponse } from "./http1_write.ts";
import { INSTANCE_HEADER } from "../wire/names.ts";

/** Where the server counts the answers it gives itself (a {@link Metrics}, or a front's counts). */
export type RequestCounts = Pick<Metrics, "recordRequest">;

/**
 * What the server's own answers carry as the handler's do: counted in `counts`, and named by the
 * instance (`X-Attention-Instance`, which docs/api.md promises on every answer; these had none).
 */
export interface OwnAnswers {
  counts?: RequestCounts;
  instance?: string;
}

/** The route label of an answer given before any route was matched (as the handler's). */
const NO_ROUTE = "unmatched";

/** The longest method counted under its own name ("OPTIONS", "CONNECT"), and its space. */
const METHOD_BYTES = 8;

/**
 * The method a head's bytes begin with (leading blank lines already skipped), for a label: ""
 * when no space follows one within {@link METHOD_BYTES}; counted as `other` unless known.
 */
export function sentMethod(head: Uint8Array): string {
  const sp = head.subarray(0, METHOD_BYTES).indexOf(32);
  return sp > 0 ? isoLatin1(head.subarray(0, sp)) : "";
}

/** A problem answer of this server's own (the head was refused before any handler saw it). */
function engineProblem(p: HeadProblem, instance?: string): Response {
  const res = problemResponse({
    type: problemType(p.code),
    title: p.status === 408 ? "Request Timeout" : "HTTP protocol error",
    status: p.status,
    detail: p.detail,
    code: p.code,
    ...p.extra,
  });
  if (instance !== undefined) res.headers.set(INSTANCE_HEADER, instance);
  return res;
}

/** `p` answered and counted (`method` as sent, or "" when none came). */
function answer(p: HeadProblem, method: string, own: OwnAnswers = {}): Response {
  own.counts?.recordRequest(NO_ROUTE, method, p.status, p.code);
  return engineProblem(p, own.instance);
}

/** The 408 of a head not whole `ms` after its first byte. */
export function timeoutProblem(ms: number): HeadProblem {
  return {
    status: 408,
    code: "head_timeout",
    detail: `request head did not arrive within ${ms} ms`,
    extra: { head_timeout_ms: ms },
  };
}

/** The 431 of a head over {@link MAX_HEAD_BYTES}. */
export const TOO_LARGE: HeadProblem = {
  status: 431,
  code: "headers_too_large",
  detail: `request head is over the ${MAX_HEAD_BYTES} bytes taken`,
  extra: { max_head_bytes: MAX_HEAD_BYTES },
};

/** One connection over the cap of `max`: a 503, counted, and close. */
export function refuse(conn: Deno.Conn, max: number, own?: OwnAnswers): void {
  const res = answer(
    {
      status: 503,
      code: "too_many_connections",
      detail: `the server holds its limit of ${max} connections; retry later`,
      extra: { max_connections: max },
    },
    "",
    own,
  );
  writeResponse(conn, res, { head: false, close: true })
    .then(() => linger(new ConnReader(conn, 4096), 200))
    .catch(() => {})
    .finally(() => closeQuietly(conn));
}

/** A refused head's problem, counted, then a lingering close (what the client sends is read). */
export async function refuseHead(
  r: ConnReader,
  p: HeadProblem,
  method: string,
  own?: OwnAnswers,
): Promise<void> {
  // An answer to HEAD carries no content (RFC 9110 9.3.2), a refusal's neither.
  await writeResponse(r.conn, answer(p, method, own), { head: method === "HEAD", close: true });
  if (!r.eof && !r.broken) await linger(r);
}

/**
 * A closing answer's unread bytes: the write side shut, what still comes read and dropped for up
 * to `ms` (so that the client reads the answer instead of a reset).
 */
export async function linger(r: ConnReader, ms = 1000): Promise<void> {
  try {
    await (r.conn as Deno.TcpConn).closeWrite();
  } catch { /* closed already */ }
  await r.discard(ms, 16 * 1024 * 1024);
}

/** Closes `conn`, closed already or not. */
export function closeQuietly(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch { /* closed already */ }
}
