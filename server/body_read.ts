/**
 * Reading a request body within a size limit: a declared Content-Length over the limit is a
 * 413 before any byte is read, bytes are counted while streaming so chunked bodies are capped
 * too (413), and a body cut short by the client is a 400 `body_incomplete`. Memory follows the
 * bytes received; each byte is copied once into the one buffer the body ends up in.
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import {
  bodyTimeoutMs,
  patientTimeout,
  readWithin,
  timedOut,
  wholeBodyDeadlineMs,
} from "./body_timeout.ts";

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

/**
 * The bytes of a body as they arrive, into one buffer: chunks are kept as they came until
 * half the declared length (or, without one, the whole body) has arrived, then copied into one
 * buffer of the final size (one chunk that is the whole body, 8-byte aligned, is kept as it
 * is), and later chunks go straight into it; so every byte is copied at most once and memory
 * stays within about twice what was received.
 */
export class BodyBuffer {
  #buf: Uint8Array | null = null;
  #chunks: Uint8Array[] = [];
  total = 0;

  constructor(readonly declared: number) {}

  add(chunk: Uint8Array): void {
    if (this.#buf === null) {
      this.#chunks.push(chunk);
      this.total += chunk.byteLength;
      if (this.declared >= 0 && 2 * this.total >= this.declared) this.#gather(this.declared);
      return;
    }
    if (this.total + chunk.byteLength > this.#buf.byteLength) this.#grow(chunk.byteLength);
    this.#buf.set(chunk, this.total);
    this.total += chunk.byteLength;
  }

  /** Bytes held now (chunks kept, or the buffer). */
  get reserved(): number {
    return this.#buf?.byteLength ?? this.#chunks.reduce((n, c) => n + c.byteLength, 0);
  }

  /** The body, in one buffer of its exact length. */
  bytes(): Uint8Array {
    if (this.#buf === null) this.#gather(this.total);
    const buf = this.#buf!;
    return this.total === buf.byteLength ? buf : buf.subarray(0, this.total);
  }

  #gather(size: number): void {
    const chunks = this.#chunks;
    // One chunk of the exact size is the body (kept only when 8-byte aligned: safetensors
    // data offsets are relative to the body's start).
    if (chunks.length === 1 && chunks[0].byteLength === size && chunks[0].byteOffset % 8 === 0) {
      this.#buf = chunks[0];
    } else {
      this.#buf = new Uint8Array(Math.max(size, this.total));
      let at = 0;
      for (const c of chunks) {
        this.#buf.set(c, at);
        at += c.byteLength;
      }
    }
    this.#chunks = [];
  }

  /** More than the declared length arrives only if the stream misbehaves: grow to fit. */
  #grow(extra: number): void {
    const grown = new Uint8Array(Math.max(2 * this.#buf!.byteLength, this.total + extra));
    grown.set(this.#buf!.subarray(0, this.total));
    this.#buf = grown;
  }
}

/**
 * The value of a Content-Length header: -1 when absent, NaN when it is not a decimal count
 * (leading and trailing blanks allowed).
 */
export function contentLength(header: string | null): number {
  if (header === null) return -1;
  const v = header.trim();
  if (v.length === 0) return NaN;
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 48 || c > 57) return NaN;
  }
  return Number(v);
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

/**
 * Bodies read in one piece ({@link wholeBody}) are fast (one op instead of one op and promise a
 * 64 KiB chunk: on the dev VM 71-104 ms against 127-190 ms streamed for 64 MiB), but Deno's
 * `req.bytes()` allocates its buffer from the Content-Length (up to 16 MiB) before a byte
 * arrives, and keeps it until the read ends, which for a stalled body is when its client closes
 * (a 408 does not close the socket): 30 connections declaring 64 MiB and sending 1 KiB held 0.5
 * GB. So the buffers of the reads in flight in this isolate are budgeted: a read takes
 * min(declared, 16 MiB) of {@link WHOLE_READ_BUDGET_BYTES} until `req.bytes()` settles, and a
 * body that does not fit is streamed, its memory following the bytes received.
 */
export const WHOLE_READ_BUDGET_BYTES = 64 * 1024 * 1024;

/** What `req.bytes()` allocates ahead for a declared length, at most (Deno 2.9, measured). */
const WHOLE_READ_AHEAD_MAX = 16 * 1024 * 1024;

let wholeReadBytes = 0;

/**
 * `req`'s body read in one piece when its declared length fits what is left of
 * {@link WHOLE_READ_BUDGET_BYTES}, else null: the caller streams it.
 */
export function wholeBodyIfCheap(req: Request, declared: number): Promise<StreamedBody> | null {
  if (declared < 0) return null;
  const cost = Math.min(declared, WHOLE_READ_AHEAD_MAX);
  if (wholeReadBytes + cost > WHOLE_READ_BUDGET_BYTES) return null;
  wholeReadBytes += cost;
  return wholeBody(req, () => wholeReadBytes -= cost);
}

/**
 * Reads a body of declared length in one piece (Deno's `req.bytes()`: one op, where a stream
 * read takes one op and one promise per 64 KB chunk). A failed read is an `error` end with
 * nothing kept (`uncounted`: Deno does not say how much came). Such a read sees no chunks, so
 * its time limit is a deadline, not a gap: body_timeout.ts `wholeBodyDeadlineMs`.
 */
export async function wholeBody(req: Request, settled?: () => void): Promise<StreamedBody> {
  const limit = wholeBodyDeadlineMs(contentLength(req.headers.get("content-length")));
  const late = patientTimeout(limit);
  const read = req.bytes();
  // A read left behind by a timeout ends when the connection closes; `settled` runs then.
  read.then(settled, settled).catch(() => {});
  try {
    const bytes = await Promise.race([read, late.done]);
    if (bytes === null) {
      return { bytes: new Uint8Array(0), end: "timeout", timeout_ms: limit, uncounted: true };
    }
    return { bytes: aligned(bytes), end: "complete" };
  } catch (e) {
    return { bytes: new Uint8Array(0), end: "error", cause: e, uncounted: true };
  } finally {
    late.cancel();
  }
}

/**
 * Reads a body stream chunk by chunk into a {@link BodyBuffer}, counting bytes against
 * `limit`. Once the declared length has arrived the stream is read once more, to its end:
 * Deno's server answers a request whose body stream is left open about 0.1 ms later (measured
 * on loopback). That last read failing (a client that half-closes after its last byte) is no
 * error: the body is whole. Used by {@link readBody} and by the HTTP workers.
 */
export async function streamBody(
  stream: ReadableStream<Uint8Array>,
  declared: number,
  limit: number,
): Promise<StreamedBody> {
  const reader = stream.getReader();
  const body = new BodyBuffer(declared);
  let end: StreamedBody["end"] = "complete";
  let cause: unknown;
  const ms = bodyTimeoutMs();
  while (declared < 0 || body.total < declared) {
    let chunk: ReadableStreamReadResult<Uint8Array> | null;
    try {
      chunk = await readWithin(reader, ms);
    } catch (e) {
      end = "error";
      cause = e;
      break;
    }
    if (chunk === null) {
      reader.releaseLock(); // the read left pending fails once the stream is cancelled
      await stream.cancel().catch(() => {});
      return { bytes: body.bytes(), end: "timeout", timeout_ms: ms };
    }
    if (chunk.done) break;
    body.add(chunk.value);
    if (body.total > limit) {
      end = "too_large";
      await reader.cancel().catch(() => {});
      break;
    }
  }
  if (end === "complete" && declared >= 0 && body.total >= declared) {
    await reader.read().catch(() => {});
  }
  reader.releaseLock();
  return { bytes: body.bytes(), end, cause };
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

/** Bytes that start 8-byte aligned (safetensors data offsets count from the body's start). */
function aligned(b: Uint8Array): Uint8Array {
  return b.byteOffset % 8 === 0 ? b : b.slice();
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
