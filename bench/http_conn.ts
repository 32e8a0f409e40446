/**
 * A lean HTTP/1.1 client for the HTTP bench: one keep-alive TCP connection, requests built
 * whole (head and body in one buffer) before the clock starts, answers read straight into one
 * buffer of their `Content-Length` (chunked answers and answers ended by the server's close
 * are read too). It stands for an engine's own client: measured on loopback (2-core AMD EPYC
 * VM, Deno 2.9.6), Deno's `fetch` spent about 0.15-0.25 ms more per decode-step call (420 KB
 * up, 262 KB down) than this, time that is the bench client's, not the server's.
 *
 * Plain `http:` only. A connection the server closed while idle is reopened, and a request
 * that found its reused connection closed before any answer byte came is sent once more.
 * @module
 */
import { concatBytes } from "../core/safetensors.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** An answer: status, headers (names lower case) and the whole body. */
export interface RawAnswer {
  status: number;
  headers: Map<string, string>;
  body: Uint8Array;
}

/** Thrown when the server's answer is not well-formed HTTP/1.1. */
export class HttpProtocolError extends Error {
  override name = "HttpProtocolError";
}

/** Where a URL points: host and port of an `http:` URL. */
export function endpointOf(url: string): { hostname: string; port: number; host: string } {
  const u = new URL(url);
  if (u.protocol !== "http:") {
    throw new Error(
      `the bench's raw HTTP client speaks plain http only, got ${u.protocol} in ${url}`,
    );
  }
  const hostname = u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname;
  return { hostname, port: u.port ? Number(u.port) : 80, host: u.host };
}

/**
 * One request as bytes: the head (`Host`, `Content-Length`, the given headers) and the body,
 * in one buffer.
 */
export function rawRequest(
  method: string,
  url: string,
  headers: Record<string, string>,
  body: Uint8Array,
): Uint8Array {
  const u = new URL(url);
  const lines = [`${method} ${u.pathname}${u.search} HTTP/1.1`, `host: ${u.host}`];
  for (const [k, v] of Object.entries(headers)) {
    if (/[\r\n]/.test(k + v)) throw new Error(`header ${k}: line breaks are not allowed`);
    lines.push(`${k}: ${v}`);
  }
  lines.push(`content-length: ${body.byteLength}`, "", "");
  const head = encoder.encode(lines.join("\r\n"));
  const out = new Uint8Array(head.byteLength + body.byteLength);
  out.set(head);
  out.set(body, head.byteLength);
  return out;
}

function indexOfHeadEnd(b: Uint8Array, from: number, to: number): number {
  for (let i = Math.max(from, 3); i < to; i++) {
    if (b[i] === 10 && b[i - 1] === 13 && b[i - 2] === 10 && b[i - 3] === 13) return i + 1;
  }
  return -1;
}

/** How a connection hands out answers. */
export interface HttpConnOptions {
  /**
   * Read each answer with a `Content-Length` into one buffer kept for the connection (grown
   * when an answer is larger) instead of a fresh one: an answer's body is then valid only until
   * the next `send`. An engine's client that consumes each answer before the next call saves
   * the allocation, zeroing and page faults of a fresh buffer a call (262 KB for issue 7's
   * decode step). Default false.
   */
  reuseAnswer?: boolean;
}

/** A keep-alive HTTP/1.1 connection to one server. */
export class HttpConn {
  #endpoint: { hostname: string; port: number };
  #conn: Deno.TcpConn | null = null;
  /** Bytes read past the last answer (none while the server does not pipeline). */
  #buf = new Uint8Array(64 * 1024);
  #have = 0;
  /** The answer buffer of `reuseAnswer`, null until the first answer (or without it). */
  #answerBuf: Uint8Array | null = null;
  #reuse: boolean;

  constructor(url: string, options: HttpConnOptions = {}) {
    this.#endpoint = endpointOf(url);
    this.#reuse = options.reuseAnswer === true;
  }

  /** Sends a request built by {@link rawRequest} and reads its answer. */
  async send(request: Uint8Array): Promise<RawAnswer> {
    const reused = this.#conn !== null;
    const conn = this.#conn ??= await Deno.connect(this.#endpoint);
    let got = false;
    try {
      await this.#writeAll(conn, request);
      return await this.#answer(conn, () => got = true);
    } catch (e) {
      this.close();
      if (reused && !got && !(e instanceof HttpProtocolError)) return await this.send(request);
      throw e;
    }
  }

  /** Closes the connection (the next send opens another). */
  close(): void {
    try {
      this.#conn?.close();
    } catch { /* already closed */ }
    this.#conn = null;
    this.#have = 0;
  }

  async #writeAll(conn: Deno.TcpConn, bytes: Uint8Array): Promise<void> {
    for (let off = 0; off < bytes.byteLength;) off += await conn.write(bytes.subarray(off));
  }

  /** Reads more into the head buffer; false at end of stream. */
  async #more(conn: Deno.TcpConn): Promise<boolean> {
    if (this.#have === this.#buf.byteLength) {
      const grown = new Uint8Array(2 * this.#buf.byteLength);
      grown.set(this.#buf);
      this.#buf = grown;
    }
    const n = await conn.read(this.#buf.subarray(this.#have));
    if (n === null) return false;
    this.#have += n;
    return true;
  }

  /** Takes `n` bytes off the front of the head buffer. */
  #consume(n: number): void {
    this.#buf.copyWithin(0, n, this.#have);
    this.#have -= n;
  }

  async #answer(conn: Deno.TcpConn, started: () => void): Promise<RawAnswer> {
    let end = indexOfHeadEnd(this.#buf, 0, this.#have);
    while (end < 0) {
      const from = this.#have - 3;
      if (!await this.#more(conn)) throw new Error("connection closed before an answer");
      started();
      end = indexOfHeadEnd(this.#buf, from, this.#have);
    }
    const lines = decoder.decode(this.#buf.subarray(0, end - 4)).split("\r\n");
    const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]);
    if (!m) throw new HttpProtocolError(`not an HTTP/1.1 status line: ${JSON.stringify(lines[0])}`);
    const headers = new Map<string, string>();
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(":");
      if (colon > 0) {
        headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
      }
    }
    this.#consume(end);
    const status = Number(m[1]);
    const length = headers.get("content-length");
    let body: Uint8Array;
    if (status === 204 || status === 304) body = new Uint8Array(0);
    else if (/chunked/i.test(headers.get("transfer-encoding") ?? "")) {
      body = await this.#chunked(conn);
    } else if (length !== undefined) {
      body = await this.#exactly(conn, Number(length), this.#reuse);
    } else body = await this.#toEnd(conn);
    if (/close/i.test(headers.get("connection") ?? "")) this.close();
    return { status, headers, body };
  }

  /**
   * `n` bytes into a buffer of their own (`reuse`: the connection's answer buffer): what is
   * buffered, then reads straight into it.
   */
  async #exactly(conn: Deno.TcpConn, n: number, reuse = false): Promise<Uint8Array> {
    if (!Number.isSafeInteger(n) || n < 0) throw new HttpProtocolError(`bad content-length ${n}`);
    const out = reuse ? this.#answerInto(n) : new Uint8Array(n);
    const first = Math.min(n, this.#have);
    out.set(this.#buf.subarray(0, first));
    this.#consume(first);
    for (let at = first; at < n;) {
      const got = await conn.read(out.subarray(at));
      if (got === null) throw new Error(`connection closed after ${at} of ${n} body bytes`);
      at += got;
    }
    return out;
  }

  /** The first `n` bytes of the kept answer buffer, grown to at least `n` first. */
  #answerInto(n: number): Uint8Array {
    if (!this.#answerBuf || this.#answerBuf.byteLength < n) this.#answerBuf = new Uint8Array(n);
    return this.#answerBuf.subarray(0, n);
  }

  async #line(conn: Deno.TcpConn): Promise<string> {
    for (;;) {
      const i = this.#buf.subarray(0, this.#have).indexOf(10);
      if (i >= 0) {
        const line = decoder.decode(this.#buf.subarray(0, i)).trim();
        this.#consume(i + 1);
        return line;
      }
      if (!await this.#more(conn)) throw new Error("connection closed inside a chunked body");
    }
  }

  async #chunked(conn: Deno.TcpConn): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    for (;;) {
      const size = parseInt((await this.#line(conn)).split(";")[0], 16);
      if (!Number.isSafeInteger(size) || size < 0) throw new HttpProtocolError("bad chunk size");
      if (size === 0) break;
      parts.push(await this.#exactly(conn, size));
      await this.#line(conn);
    }
    while ((await this.#line(conn)) !== "") { /* trailers */ }
    return concatBytes(parts);
  }

  async #toEnd(conn: Deno.TcpConn): Promise<Uint8Array> {
    while (await this.#more(conn)) { /* until the server closes */ }
    const out = this.#buf.slice(0, this.#have);
    this.close();
    return out;
  }
}
