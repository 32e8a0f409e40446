/**
 * Reading a request body within a size limit: a declared Content-Length over the limit is a
 * 413 before any byte is read, bytes are counted while streaming so chunked bodies are capped
 * too (413), and a body cut short by the client is a 400 `body_incomplete`. Memory follows the
 * bytes received; each byte is copied once into the one buffer the body ends up in.
 *
 * The parts live beside it: the buffer a body is read into (body_buffer.ts), the Content-Length
 * value (content_length.ts), reads in one piece within their budget (body_whole_read.ts) and
 * reads of a body stream (body_stream_read.ts); their exports are re-exported here.
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import { bodyTimeoutMs, timedOut } from "./body_timeout.ts";
import { contentLength } from "./content_length.ts";
import { wholeBody, wholeBodyIfCheap } from "./body_whole_read.ts";
import { streamBody } from "./body_stream_read.ts";

export { BodyBuffer } from "./body_buffer.ts";
export { contentLength, streamBody, wholeBody, wholeBodyIfCheap };
export { WHOLE_READ_BUDGET_BYTES } from "./body_whole_read.ts";

/** A body size limit and the flag that sets it (named in the 413). */
export interface BodyLimit {
  bytes: number;
  /** The problem field naming the limit, e.g. `max_body_bytes`. */
  field: string;
  /** What kind of body it applies to, for the message (e.g. "JSON "). */
  kind?: string;
}

function tooLarge(limit: BodyLimit, seen: number | string): ServiceError {
  return new ServiceError(
    `${limit.kind ?? ""}request body of ${seen} bytes exceeds the ${limit.bytes}-byte limit`,
    { status: 413, code: "body_too_large", extra: { [limit.field]: limit.bytes } },
  );
}

/**
 * A body whose framing is broken (a chunked coding that is not RFC 9112 7.1's): the client sent
 * bytes the server cannot read as a body, which is not a body cut short.
 */
export class BodyFramingError extends Error {}

/**
 * A body that could not be read to its end: cut short (400 `body_incomplete`; `got` -1 when how
 * much arrived is unknown, a whole read that failed), or framed wrongly ({@link
 * BodyFramingError}: 400 `bad_chunked_body`).
 */
function incomplete(got: number, declared: number, cause: unknown): ServiceError {
  if (cause instanceof BodyFramingError) {
    return new ServiceError(`request body's chunked coding is not valid: ${cause.message}`, {
      status: 400,
      code: "bad_chunked_body",
      extra: { received_bytes: Math.max(0, got) },
    });
  }
  const why = cause instanceof Error ? `: ${cause.message}` : "";
  const of = declared >= 0 ? ` of the ${declared} declared` : "";
  if (got < 0) {
    return new ServiceError(
      `request body ended before its ${declared} declared bytes: the client stopped sending${why}`,
      { status: 400, code: "body_incomplete", extra: { declared_bytes: declared } },
    );
  }
  return new ServiceError(
    `request body ended after ${got}${of} bytes: the client stopped sending${why}`,
    { status: 400, code: "body_incomplete", extra: { received_bytes: got } },
  );
}

/** How a streamed read of a body ended, and what arrived. */
export interface StreamedBody {
  bytes: Uint8Array;
  /** `complete`: the declared length (or the stream's end) arrived; `too_large`: more than the
   * limit arrived (the chunk that ran over is kept); `error`: the stream failed (`cause`);
   * `timeout`: no bytes came for {@link bodyTimeoutMs}, or a body read in one piece was not
   * whole by its deadline (`timeout_ms`: the limit that ran out). */
  end: "complete" | "too_large" | "error" | "timeout";
  /** A `timeout` end: the limit that ran out, in ms. */
  timeout_ms?: number;
  cause?: unknown;
  /** A whole read ({@link wholeBody}) failed: how many bytes came is not known. */
  uncounted?: boolean;
  /**
   * A read another thread made: what the body waited between threads to come here, ms
   * (request_arrival.ts; undefined: read on this thread).
   */
  waitedMs?: number;
  /**
   * A read another thread made before passing the request on (request_sender.ts readBody, the
   * device-threads front's): how long it took there, ms, which the owner's `parse` counts
   * (request_arrival.ts readElsewhere).
   */
  readMs?: number;
}

/** A body read before the handler ran (by an HTTP worker), as {@link readBody} takes it. */
const preRead = new WeakMap<Request, Promise<StreamedBody>>();

/** Says that `req`'s body was read already: {@link readBody} takes `body` instead of streaming. */
export function setPreReadBody(req: Request, body: Promise<StreamedBody>): void {
  preRead.set(req, body);
}

/**
 * The read of `req`'s body made before the handler ran ({@link setPreReadBody}), or undefined:
 * a RequestSender that passes such a request on posts that read, ended as it ended (a timeout
 * with the bytes that came), instead of reading the rebuilt body again (request_sender.ts).
 */
export function preReadBody(req: Request): Promise<StreamedBody> | undefined {
  return preRead.get(req);
}

/**
 * A body the server reads itself when asked (http1_server.ts), within the reader's limit;
 * `borrow`: the reader gives the bytes up once the request's answer is built (nothing keeps a
 * view of them), so the server may read them into memory it reuses afterwards.
 */
export type BodySource = (limit: number, borrow: boolean) => Promise<StreamedBody>;

const sources = new WeakMap<Request, BodySource>();

/** Says where `req`'s body comes from: {@link readBody} calls `source` instead of streaming. */
export function setBodySource(req: Request, source: BodySource): void {
  sources.set(req, source);
}

/** Where `req`'s body comes from when {@link setBodySource} said (a front that passes it on). */
export function bodySourceOf(req: Request): BodySource | undefined {
  return sources.get(req);
}

/**
 * Reads the whole body, refusing more than `limit` bytes: a declared Content-Length over the
 * limit fails before reading (413); otherwise bytes are counted as they stream in (413 past
 * the limit). A body the client stops sending is a 400 `body_incomplete` with
 * `received_bytes`.
 *
 * `whole: true` (safetensors forward bodies, the hot path) reads a body of declared length in one
 * piece where {@link wholeBodyIfCheap} allows (Deno's `req.bytes()`, one op: 0.006 ms for 412 KB on
 * loopback against 0.15-0.3 ms for its seven stream chunks, on the 2-core dev VM). Two things
 * differ there: a body cut short is still a 400 `body_incomplete`, but without `received_bytes`
 * (Deno does not say how many came); and a client that half-closes right after its last byte may
 * get that 400 (Deno drops such a request's body), where the streamed read keeps the bytes. Such a
 * client may lose its answer anyway (see README, HTTP workers).
 *
 * `borrow: true` says the caller keeps no view of the bytes past the request's answer (a
 * forward's safetensors body: its tensors are uploaded or copied during the call): the service's
 * own HTTP/1.1 server may then read them into a buffer it reuses (http1_body_pool.ts).
 */
export async function readBody(
  req: Request,
  limit: number | BodyLimit,
  opts: { whole?: boolean; borrow?: boolean } = {},
): Promise<Uint8Array> {
  const lim: BodyLimit = typeof limit === "number"
    ? { bytes: limit, field: "max_body_bytes" }
    : limit;
  const cl = req.headers.get("content-length");
  const declared = contentLength(cl);
  if (Number.isNaN(declared)) {
    throw new ServiceError(`invalid Content-Length ${JSON.stringify(cl)}`, {
      status: 400,
      code: "bad_request",
    });
  }
  if (declared > lim.bytes) throw tooLarge(lim, declared);
  const pre = preRead.get(req);
  const source = sources.get(req);
  let read: StreamedBody;
  if (pre !== undefined) read = await pre;
  else if (source !== undefined) read = await source(lim.bytes, opts.borrow === true);
  // Not `req.body` first: that getter builds a ReadableStream, and `req.bytes()` then collects
  // the body through it, chunk by chunk, instead of in one op.
  else {
    const whole = opts.whole ? wholeBodyIfCheap(req, declared) : null;
    if (whole) read = await whole;
    else if (!req.body) return new Uint8Array(0);
    else read = await streamBody(req.body, declared, lim.bytes);
  }
  const got = read.bytes.byteLength;
  if (read.end === "timeout") {
    const whole = read.uncounted === true;
    throw whole
      ? timedOut(-1, declared, bodyTimeoutMs(), read.timeout_ms)
      : timedOut(got, declared, read.timeout_ms ?? bodyTimeoutMs());
  }
  if (read.end === "too_large" || got > lim.bytes) throw tooLarge(lim, `more than ${lim.bytes}`);
  if (read.end === "error") throw incomplete(read.uncounted ? -1 : got, declared, read.cause);
  if (declared >= 0 && got < declared) throw incomplete(got, declared, undefined);
  return read.bytes;
}
