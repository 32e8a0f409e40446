/**
 * The buffer a request body is read into as it arrives (body_read.ts, http1_reader.ts): every
 * byte copied at most once, memory within about twice what was received.
 * @module
 */

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
