/**
 * Reading a request body within a size limit: a declared Content-Length over the limit is a
 * 413 before any byte is read, bytes are counted while streaming so chunked bodies are capped
 * too (413), and a body cut short by the client is a 400 `body_incomplete`. Memory follows the
 * bytes received; each byte is copied once into the one buffer the body ends up in.
 * @module
 */
import { ServiceError } from "../core/errors.ts";

/** First buffer of a body read: never more than this before bytes actually arrive. */
const INITIAL_BODY_BUFFER = 1024 * 1024;

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

function incomplete(got: number, declared: number, cause: unknown): ServiceError {
  const why = cause instanceof Error ? `: ${cause.message}` : "";
  const of = declared >= 0 ? ` of the ${declared} declared` : "";
  return new ServiceError(
    `request body ended after ${got}${of} bytes: the client stopped sending${why}`,
    { status: 400, code: "body_incomplete", extra: { received_bytes: got } },
  );
}

/**
 * The bytes of a body as they arrive, into one buffer: a first chunk that is the whole declared
 * body (8-byte aligned) is kept as it is; else up to {@link INITIAL_BODY_BUFFER} of a declared
 * length is reserved at the first chunk; beyond that chunks are kept as they came until half
 * the declared length (or, without one, the whole body) has arrived, then copied into one
 * buffer of the final size, so every byte is copied once and memory stays within about twice
 * what was received.
 */
export class BodyBuffer {
  #buf: Uint8Array | null = null;
  #chunks: Uint8Array[] = [];
  total = 0;

  constructor(readonly declared: number) {}

  add(chunk: Uint8Array): void {
    if (this.#buf === null && this.total === 0 && this.declared >= 0) {
      if (chunk.byteLength === this.declared && chunk.byteOffset % 8 === 0) {
        this.#buf = chunk; // the whole body in one chunk (as the HTTP workers send it): kept
        this.total = chunk.byteLength;
        return;
      }
      if (this.declared <= INITIAL_BODY_BUFFER) this.#buf = new Uint8Array(this.declared);
    }
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
 * Reads the whole body, refusing more than `limit` bytes: a declared Content-Length over the
 * limit fails before reading; otherwise bytes are counted as they stream in. Memory follows
 * the bytes received (see {@link BodyBuffer}: a declared length reserves at most 1 MiB up
 * front). A body the client stops sending is a 400 `body_incomplete`.
 *
 * Once the declared length has arrived the stream is read once more, to its end: Deno's server
 * answers a request whose body stream is left open about 0.1 ms later (measured on loopback).
 * That last read failing (a client that half-closes after its last byte) is no error: the body
 * is whole.
 */
export async function readBody(req: Request, limit: number | BodyLimit): Promise<Uint8Array> {
  const lim: BodyLimit = typeof limit === "number"
    ? { bytes: limit, field: "max_body_bytes" }
    : limit;
  const cl = req.headers.get("content-length");
  let declared = -1;
  if (cl !== null) {
    if (!/^\d+$/.test(cl.trim())) {
      throw new ServiceError(`invalid Content-Length ${JSON.stringify(cl)}`, {
        status: 400,
        code: "bad_request",
      });
    }
    declared = Number(cl);
    if (declared > lim.bytes) throw tooLarge(lim, declared);
  }
  if (!req.body) return new Uint8Array(0);
  const reader = req.body.getReader();
  const body = new BodyBuffer(declared);
  while (declared < 0 || body.total < declared) {
    let chunk: ReadableStreamReadResult<Uint8Array>;
    try {
      chunk = await reader.read();
    } catch (e) {
      throw incomplete(body.total, declared, e);
    }
    if (chunk.done) break;
    if (body.total + chunk.value.byteLength > lim.bytes) {
      await reader.cancel().catch(() => {});
      throw tooLarge(lim, `more than ${lim.bytes}`);
    }
    body.add(chunk.value);
  }
  if (declared >= 0 && body.total < declared) throw incomplete(body.total, declared, undefined);
  if (declared >= 0) await reader.read().catch(() => {});
  reader.releaseLock();
  return body.bytes();
}
