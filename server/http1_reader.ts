/**
 * The read side of one HTTP/1.1 connection (http1_server.ts): a buffer the heads are parsed
 * from, reads with time limits, and request bodies framed by Content-Length or chunked coding,
 * each read once into the buffer the body ends up in (a body of declared length straight from
 * the socket into it: no 64 KiB chunks, no copy but the bytes that came with the head).
 *
 * At most one socket read is in flight; it always fills the buffer's free tail, and the buffer
 * is compacted or grown only while none is. A read that times out leaves the connection
 * unusable (`broken`): the caller closes it, which ends the read.
 *
 * Beside it: a body read's gap limit and early end (http1_body_gap.ts), and the reads of a
 * chunked body (http1_chunked_body.ts, which {@link ConnReader.chunkedBody} calls).
 * @module
 */
import { BodyBuffer } from "./body_buffer.ts";
import type { StreamedBody } from "./body_read.ts";
import { headEnd, MAX_HEAD_BYTES } from "./http1_head.ts";
import { patientTimeout } from "./body_timeout.ts";
import { ended, GapTimer } from "./http1_body_gap.ts";
import { readChunkedBody } from "./http1_chunked_body.ts";

/** How a wait for bytes ended. */
export type FillResult = "data" | "eof" | "timeout";

/**
 * A body of declared length up to this is read into one buffer of that size made up front. Such
 * a buffer's pages are committed as the bytes land (measured, dev VM: 2 GiB of buffers made, RSS
 * +2 MiB), so memory follows the bytes that came, as with a body read in pieces, without the
 * pieces' copy (a 100 MB prefill body in 1 MiB pieces took 101 ms to read on an H100 host).
 */
export const DIRECT_BODY_MAX = 1024 * 1024 * 1024;

/** Declared bytes the direct reads in flight may reserve (address space, not memory) at most. */
const DIRECT_BUDGET_BYTES = 8 * 1024 * 1024 * 1024;
let directBytes = 0;

/** Size of the pieces a body read in pieces is read into. */
const PIECE_BYTES = 1024 * 1024;

/** One connection's reads. */
export class ConnReader {
  buf: Uint8Array;
  /** Unconsumed bytes are `buf[start, end)`. */
  start = 0;
  end = 0;
  eof = false;
  broken = false;
  #pending: Promise<FillResult> | null = null;

  constructor(readonly conn: Deno.Conn, size = 16 * 1024) {
    this.buf = new Uint8Array(size);
  }

  get available(): number {
    return this.end - this.start;
  }

  consume(n: number): void {
    this.start += n;
    // Not while a read is in flight: it fills the buffer from `end` as it was when it began.
    if (this.start === this.end && this.#pending === null) this.start = this.end = 0;
  }

  /** Whether a read is in flight (see {@link probe}). */
  get reading(): boolean {
    return this.#pending !== null;
  }

  /**
   * Starts a read into the free tail unless one is in flight or the buffer is full, and
   * returns the one in flight (or null): its `eof` says the client closed.
   */
  probe(): Promise<FillResult> | null {
    if (this.#pending) return this.#pending;
    if (this.eof || this.broken || this.end === this.buf.byteLength) return null;
    const p = this.conn.read(this.buf.subarray(this.end)).then(
      (n): FillResult => {
        this.#pending = null;
        if (n === null) {
          this.eof = true;
          return "eof";
        }
        this.end += n;
        return "data";
      },
      (): FillResult => {
        this.#pending = null;
        this.eof = true;
        return "eof";
      },
    );
    this.#pending = p;
    return p;
  }

  /** Waits up to `ms` for more bytes (room made first when no read is in flight). */
  async fill(ms: number): Promise<FillResult> {
    if (this.eof) return "eof";
    if (!this.#pending) this.#makeRoom();
    const read = this.probe();
    if (read === null) return "eof";
    const t = patientTimeout(ms);
    try {
      const r = await Promise.race([read, t.done]);
      if (r !== null) return r;
      this.broken = true;
      return "timeout";
    } finally {
      t.cancel();
    }
  }

  #makeRoom(): void {
    if (this.start > 0) {
      this.buf.copyWithin(0, this.start, this.end);
      this.end -= this.start;
      this.start = 0;
    }
    if (this.end === this.buf.byteLength && this.buf.byteLength < MAX_HEAD_BYTES + 8) {
      const grown = new Uint8Array(Math.min(2 * this.buf.byteLength, MAX_HEAD_BYTES + 8));
      grown.set(this.buf.subarray(0, this.end));
      this.buf = grown;
    }
  }

  /**
   * The next head's end (an index into `buf` past its blank line, the head starting at
   * `start`), or how the wait ended: `idle` when no byte came within `idleMs`, `timeout` when the
   * head was not whole `headMs` after its first byte. Leading blank lines are skipped (RFC 9112 2.2), but they count as bytes of the
   * head: they start its time.
   */
  async nextHead(
    idleMs: number,
    headMs: number,
  ): Promise<number | "eof" | "idle" | "timeout" | "too_large"> {
    let deadline = this.available > 0 ? performance.now() + headMs : 0;
    for (;;) {
      while (this.available > 0 && (this.buf[this.start] === 10 || this.buf[this.start] === 13)) {
        if (
          this.buf[this.start] === 13 && (this.available < 2 || this.buf[this.start + 1] !== 10)
        ) {
          break; // a CR not (yet) followed by LF: the parser refuses a bare CR
        }
        this.consume(this.buf[this.start] === 13 ? 2 : 1);
      }
      if (this.available > 0) {
        const e = headEnd(this.buf, this.start, this.end); // heads are small: scan it whole
        if (e >= 0) return e;
        if (this.available > MAX_HEAD_BYTES) return "too_large";
      }
      const wait = deadline === 0 ? idleMs : Math.max(1, deadline - performance.now());
      const r = await this.fill(wait);
      if (r === "timeout" && deadline === 0) return "idle";
      if (r !== "data") return r;
      if (deadline === 0) deadline = performance.now() + headMs;
    }
  }

  /**
   * Reads and drops what the client still sends, for up to `ms` and `max` bytes or until it
   * closes: after an answer that closes the connection before a body was read, so that the
   * client reads that answer instead of a reset.
   */
  async discard(ms: number, max: number): Promise<void> {
    const until = performance.now() + ms;
    let dropped = 0;
    while (!this.eof && !this.broken && dropped < max) {
      dropped += this.available;
      this.consume(this.available);
      const left = until - performance.now();
      if (left <= 0 || await this.fill(left) !== "data") return;
    }
  }

  /**
   * A Content-Length body of `n` bytes, read as it comes; `gapMs` without bytes is a timeout.
   * `into` (at least `n` bytes): read into it instead of a new buffer.
   */
  async lengthBody(
    n: number,
    limit: number,
    gapMs: number,
    into?: ArrayBuffer,
  ): Promise<StreamedBody> {
    if (n > limit) return { bytes: new Uint8Array(0), end: "too_large" };
    const direct = n <= DIRECT_BODY_MAX && directBytes + n <= DIRECT_BUDGET_BYTES;
    if (!direct) return await this.#piecesBody(n, gapMs);
    directBytes += n;
    const gap = new GapTimer(gapMs);
    try {
      const out = into ? new Uint8Array(into, 0, n) : new Uint8Array(n);
      let got = 0;
      while (got < n) {
        const r = this.available > 0 || this.reading
          ? await this.#buffered(n - got, gap, (b) => out.set(b, got))
          : await this.#readInto(out.subarray(got), gap);
        if (typeof r !== "number") return ended(r, out.subarray(0, got), gapMs);
        got += r;
      }
      return { bytes: out, end: "complete" };
    } finally {
      gap.cancel();
      directBytes -= n;
    }
  }

  /** A large body read in pieces, its memory following the bytes that came. */
  async #piecesBody(n: number, gapMs: number): Promise<StreamedBody> {
    const body = new BodyBuffer(n);
    const gap = new GapTimer(gapMs);
    try {
      while (body.total < n) {
        if (this.available > 0 || this.reading) {
          const r = await this.#buffered(n - body.total, gap, (b) => body.add(b.slice()));
          if (typeof r !== "number") return ended(r, body.bytes(), gapMs);
          continue;
        }
        const piece = new Uint8Array(Math.min(PIECE_BYTES, n - body.total));
        const r = await this.#readInto(piece, gap);
        if (typeof r !== "number") return ended(r, body.bytes(), gapMs);
        body.add(piece.subarray(0, r));
      }
      return { bytes: body.bytes(), end: "complete" };
    } finally {
      gap.cancel();
    }
  }

  /**
   * Up to `max` body bytes from the buffer, handed to `take` and consumed; first, a read in
   * flight into the buffer (a probe that watches for the client's close) is waited out within
   * `gap`. Reading the socket beside it would put the bytes it gets after later ones: the body
   * would take the next request's bytes, and its own would be parsed as a request.
   */
  async #buffered(
    max: number,
    gap: GapTimer,
    take: (bytes: Uint8Array) => void,
  ): Promise<number | "eof" | "timeout"> {
    if (this.available === 0 && this.#pending) {
      const r = await Promise.race([this.#pending, gap.done]);
      if (r === "timeout") {
        this.broken = true;
        return r;
      }
      if (r === "eof" && this.available === 0) return r;
      gap.progress();
    }
    const n = Math.min(max, this.available);
    take(this.buf.subarray(this.start, this.start + n));
    this.consume(n);
    return n;
  }

  /** One read straight into `into` (the buffer holds nothing unconsumed), within `gap`. */
  async #readInto(into: Uint8Array, gap: GapTimer): Promise<number | "eof" | "timeout"> {
    const read = this.conn.read(into).then((n) => n ?? "eof" as const, () => "eof" as const);
    const r = await Promise.race([read, gap.done]);
    if (r === "eof") this.eof = true;
    else if (r === "timeout") this.broken = true;
    else gap.progress();
    return r;
  }

  /** A chunked body (RFC 9112 7.1), trailer fields read and dropped. */
  chunkedBody(limit: number, gapMs: number): Promise<StreamedBody> {
    return readChunkedBody(this, limit, gapMs);
  }
}
