/**
 * The read side of one HTTP/1.1 connection (http1_server.ts): a buffer the heads are parsed
 * from, reads with time limits, and request bodies framed by Content-Length or chunked coding,
 * each read once into the buffer the body ends up in (a body of declared length straight from
 * the socket into it: no 64 KiB chunks, no copy but the bytes that came with the head).
 *
 * At most one socket read is in flight; it always fills the buffer's free tail, and the buffer
 * is compacted or grown only while none is. A read that times out leaves the connection
 * unusable (`broken`): the caller closes it, which ends the read.
 * @module
 */
import { BodyBuffer, BodyFramingError, type StreamedBody } from "./body_read.ts";
import { headEnd, isoLatin1, MAX_HEAD_BYTES } from "./http1_head.ts";
import { patientTimeout } from "./body_timeout.ts";

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

/**
 * A body read's gap limit with one timer, not one a socket read: it fires `gapMs` after the
 * last progress, re-arming itself while progress keeps coming. Each wait is body_timeout.ts's
 * `patientTimeout`, as every other body read's: a timer that fired late because the thread was
 * busy waits once more before it counts.
 */
class GapTimer {
  #last = performance.now();
  #wait: { done: Promise<null>; cancel(): void } | undefined;
  #fire!: (v: "timeout") => void;
  readonly done = new Promise<"timeout">((r) => this.#fire = r);

  constructor(readonly gapMs: number) {
    this.#arm(gapMs);
  }

  #arm(ms: number): void {
    const wait = this.#wait = patientTimeout(ms);
    wait.done.then(() => {
      if (wait !== this.#wait) return; // cancelled
      const left = this.#last + this.gapMs - performance.now();
      if (left > 0) this.#arm(left);
      else this.#fire("timeout");
    });
  }

  progress(): void {
    this.#last = performance.now();
  }

  cancel(): void {
    this.#wait?.cancel();
    this.#wait = undefined;
  }
}

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
        if (typeof r !== "number") return this.#ended(r, out.subarray(0, got), gapMs);
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
          if (typeof r !== "number") return this.#ended(r, body.bytes(), gapMs);
          continue;
        }
        const piece = new Uint8Array(Math.min(PIECE_BYTES, n - body.total));
        const r = await this.#readInto(piece, gap);
        if (typeof r !== "number") return this.#ended(r, body.bytes(), gapMs);
        body.add(piece.subarray(0, r));
      }
      return { bytes: body.bytes(), end: "complete" };
    } finally {
      gap.cancel();
    }
  }

  #ended(r: "eof" | "timeout", bytes: Uint8Array, gapMs: number): StreamedBody {
    if (r === "timeout") return { bytes, end: "timeout", timeout_ms: gapMs };
    return { bytes, end: "error", cause: new Error("the connection closed") };
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
  async chunkedBody(limit: number, gapMs: number): Promise<StreamedBody> {
    const body = new BodyBuffer(-1);
    const failed = (why: string): StreamedBody => ({
      bytes: body.bytes(),
      end: "error",
      cause: new BodyFramingError(why),
    });
    for (;;) {
      const line = await this.#line(gapMs);
      if (typeof line !== "object") return this.#chunkEnd(line, body, gapMs);
      // 1*HEXDIG (RFC 9112 7.1): leading zeros are not counted against the 12 digits.
      const m = /^(?=[0-9a-fA-F])0*([0-9a-fA-F]*)[ \t]*(;.*)?$/.exec(line.text);
      if (!m) {
        return failed(`chunk size line ${JSON.stringify(line.text.slice(0, 64))} is not valid`);
      }
      // 13 or more significant digits: valid, and over any body limit (2^48 bytes and up).
      if (m[1].length > 12) return { bytes: body.bytes(), end: "too_large" };
      const size = m[1] === "" ? 0 : parseInt(m[1], 16);
      if (size === 0) break;
      if (body.total + size > limit) return { bytes: body.bytes(), end: "too_large" };
      let left = size;
      while (left > 0) {
        if (this.available === 0) {
          const r = await this.fill(gapMs);
          if (r !== "data") return this.#chunkEnd(r, body, gapMs);
        }
        const take = Math.min(left, this.available);
        body.add(this.buf.slice(this.start, this.start + take));
        this.consume(take);
        left -= take;
      }
      const crlf = await this.#line(gapMs);
      if (typeof crlf !== "object") return this.#chunkEnd(crlf, body, gapMs);
      if (crlf.text !== "") return failed("chunk data not followed by CRLF");
    }
    for (let fields = 0;; fields++) { // trailer section
      const line = await this.#line(gapMs);
      if (typeof line !== "object") return this.#chunkEnd(line, body, gapMs);
      if (line.text === "") return { bytes: body.bytes(), end: "complete" };
      if (fields > 256) return failed("trailer section over 256 fields");
    }
  }

  #chunkEnd(r: "eof" | "timeout" | "too_long", body: BodyBuffer, gapMs: number): StreamedBody {
    if (r === "too_long") {
      return {
        bytes: body.bytes(),
        end: "error",
        cause: new BodyFramingError("a chunk line is over 4096 bytes"),
      };
    }
    return this.#ended(r, body.bytes(), gapMs);
  }

  /** One CRLF-ended line (at most 4 KiB), without its CRLF. */
  async #line(ms: number): Promise<{ text: string } | "eof" | "timeout" | "too_long"> {
    for (;;) {
      // At most 4096 bytes and its CRLF, however much has arrived: a longer line that came in
      // one read was taken, one that came in two refused.
      const stop = Math.min(this.end, this.start + 4098);
      for (let i = this.start + 1; i < stop; i++) {
        if (this.buf[i] === 10 && this.buf[i - 1] === 13) {
          const text = isoLatin1(this.buf.subarray(this.start, i - 1));
          this.consume(i + 1 - this.start);
          return { text };
        }
      }
      if (this.available >= 4098) return "too_long";
      const r = await this.fill(ms);
      if (r !== "data") return r;
    }
  }
}
