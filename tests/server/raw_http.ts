import assert from "node:assert/strict";
/**
 * A raw HTTP/1.1 client over TCP for tests that must say what fetch will not: lying
 * Content-Length, bodies that stop halfway, any Host header, malformed request lines. It
 * writes the given bytes, optionally half-closes, and parses the first response.
 * @module
 */

/** One parsed response. */
export interface RawResponse {
  status: number;
  /** Lower-case header names. */
  headers: Map<string, string>;
  body: Uint8Array;
  /** The body as text. */
  text: string;
}

/** Options of {@link rawExchange}. */
export interface RawOptions {
  /**
   * Half-close after writing (the server sees end of input). Default true unless the bytes hold
   * a whole request (a head, and all of its Content-Length): Deno's server may drop an answer that is
   * not ready when it sees the half-close (the HTTP workers' answers take a message round trip).
   */
  closeWrite?: boolean;
  /** Give up after this long (default 10 s). */
  timeoutMs?: number;
  /**
   * Write the request in pieces, pausing between them (ms); the first `start` bytes (default 0)
   * go in one write before them. Default: one write.
   */
  pieces?: { size: number; pauseMs: number; start?: number };
  /**
   * A HEAD request: read until the server closes and return every byte after the head as the
   * body (which must then be empty). Needs `Connection: close`.
   */
  head?: boolean;
}

const CRLFCRLF = [13, 10, 13, 10];

function indexOfSeq(buf: Uint8Array, seq: number[], from = 0): number {
  outer: for (let i = from; i + seq.length <= buf.length; i++) {
    for (let j = 0; j < seq.length; j++) if (buf[i + j] !== seq[j]) continue outer;
    return i;
  }
  return -1;
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function dechunk(b: Uint8Array): Uint8Array | null {
  const parts: Uint8Array[] = [];
  let i = 0;
  for (;;) {
    const eol = indexOfSeq(b, [13, 10], i);
    if (eol < 0) return null;
    const n = parseInt(new TextDecoder().decode(b.subarray(i, eol)), 16);
    if (!Number.isFinite(n)) return null;
    if (n === 0) return concat(parts);
    if (eol + 2 + n > b.length) return null;
    parts.push(b.subarray(eol + 2, eol + 2 + n));
    i = eol + 4 + n;
  }
}

/** Parses the first response in `buf`, or null while it is incomplete. */
export function parseResponse(buf: Uint8Array, eof: boolean, isHead = false): RawResponse | null {
  const end = indexOfSeq(buf, CRLFCRLF);
  if (end < 0) return null;
  const head = new TextDecoder().decode(buf.subarray(0, end)).split("\r\n");
  const status = Number(head[0].split(" ")[1]);
  const headers = new Map<string, string>();
  for (const line of head.slice(1)) {
    const c = line.indexOf(":");
    headers.set(line.slice(0, c).trim().toLowerCase(), line.slice(c + 1).trim());
  }
  const rest = buf.subarray(end + 4);
  let body: Uint8Array | null;
  const cl = headers.get("content-length");
  if (isHead) body = eof ? rest : null;
  else if (cl !== undefined) body = rest.length >= Number(cl) ? rest.subarray(0, Number(cl)) : null;
  else if (headers.get("transfer-encoding")?.includes("chunked")) body = dechunk(rest);
  else body = eof ? rest : null;
  if (body === null) return null;
  return { status, headers, body, text: new TextDecoder().decode(body) };
}

/**
 * Writes `request` to 127.0.0.1:`port` and returns the first response, or null when the server
 * closed the connection without a complete one (a reset or an empty answer).
 */
/** True when the bytes hold a whole request: a head, and all of the body it declares (if any). */
function declaresWholeBody(bytes: Uint8Array): boolean {
  const text = new TextDecoder("latin1").decode(bytes.subarray(0, 8192));
  const end = /\r?\n\r?\n/.exec(text);
  if (end === null) return false;
  const head = text.slice(0, end.index + end[0].length);
  const cl = /\ncontent-length:\s*(\d+)\r?\n/i.exec(head);
  if (cl === null) return !/\ntransfer-encoding:/i.test(head);
  return bytes.length - (end.index + end[0].length) >= Number(cl[1]);
}

export async function rawExchange(
  port: number,
  request: Uint8Array | string,
  opts: RawOptions = {},
): Promise<RawResponse | null> {
  const bytes = typeof request === "string" ? new TextEncoder().encode(request) : request;
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const timer = setTimeout(() => conn.close(), opts.timeoutMs ?? 10_000);
  const parts: Uint8Array[] = [];
  try {
    try {
      if (opts.pieces) {
        const start = opts.pieces.start ?? 0;
        if (start > 0) await conn.write(bytes.subarray(0, start));
        for (let i = start; i < bytes.length; i += opts.pieces.size) {
          await conn.write(bytes.subarray(i, i + opts.pieces.size));
          await new Promise((r) => setTimeout(r, opts.pieces!.pauseMs));
        }
      } else {
        let off = 0;
        while (off < bytes.length) off += await conn.write(bytes.subarray(off));
      }
      if (opts.closeWrite ?? !declaresWholeBody(bytes)) await conn.closeWrite();
    } catch { /* the server may close first; read what it said */ }
    const buf = new Uint8Array(64 * 1024);
    for (;;) {
      let n: number | null;
      try {
        n = await conn.read(buf);
      } catch {
        n = null;
      }
      if (n === null) return parseResponse(concat(parts), true, opts.head);
      parts.push(buf.slice(0, n));
      const r = parseResponse(concat(parts), false, opts.head);
      if (r) return r;
    }
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch { /* closed by the timer */ }
  }
}

/** A request head plus body as bytes (`Connection: close` unless the headers say). */
export function rawRequest(
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: Uint8Array | string,
): Uint8Array {
  const b = typeof body === "string" ? new TextEncoder().encode(body) : body ?? new Uint8Array(0);
  const h = { host: "127.0.0.1", connection: "close", ...headers };
  const head = `${method} ${path} HTTP/1.1\r\n` +
    Object.entries(h).map(([k, v]) => `${k}: ${v}\r\n`).join("") + "\r\n";
  return concat([new TextEncoder().encode(head), b]);
}

/** Reads one answer off `conn`, which stays open (keep-alive). */
export async function answerOn(conn: Deno.Conn): Promise<RawResponse> {
  let got = new Uint8Array(0);
  const buf = new Uint8Array(64 * 1024);
  for (;;) {
    const n = await conn.read(buf);
    const more = new Uint8Array(got.length + (n ?? 0));
    more.set(got);
    more.set(buf.subarray(0, n ?? 0), got.length);
    got = more;
    const r = parseResponse(got, n === null);
    if (r) return r;
    if (n === null) throw new Error("connection closed before an answer");
  }
}

/** The protocol tests' request heads, fields still open: a GET of /healthz, a JSON cache create. */
export const RAW_GET = "GET /healthz HTTP/1.1\r\nhost: x\r\n";
export const RAW_POST =
  "POST /v1/kv-caches HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n";

/**
 * What both HTTP servers pass to the handler (protocol_test.ts, http1_protocol_test.ts): each of
 * `requests` (a GET of /healthz) answered 200, and a chunked body cut inside its chunk the
 * handler's 400 `body_incomplete`. @throws AssertionError on the first that is not.
 */
export async function expectHandlerAnswers(port: number, requests: string[]): Promise<void> {
  for (const req of requests) {
    const r = await rawExchange(port, req);
    assert.equal(r?.status, 200, JSON.stringify(req));
  }
  const cut = await rawExchange(port, `${RAW_POST}transfer-encoding: chunked\r\n\r\n5\r\n{"num`);
  assert.equal(cut?.status, 400);
  assert.equal(JSON.parse(cut!.text).code, "body_incomplete");
}
