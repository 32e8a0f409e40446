/**
 * The write side of one HTTP/1.1 connection (http1_server.ts): a Response as a status line,
 * its header fields and its body. A body built here from bytes (responses.ts `bodyPartsOf`: a
 * forward's read-back, a cache export) is written from those bytes, uncopied but for small
 * pieces gathered into one write with the head; a lent body's memory goes back to its pool once
 * written (lent_body.ts). Any other body is read from the Response: streamed as it comes when
 * it declares its length, else read whole and sent with one.
 * @module
 */
import { bodyPartsOf } from "./responses.ts";
import { releaseWhenDelivered } from "./lent_body.ts";

const REASONS: Record<number, string> = {
  100: "Continue",
  200: "OK",
  201: "Created",
  202: "Accepted",
  204: "No Content",
  304: "Not Modified",
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  406: "Not Acceptable",
  408: "Request Timeout",
  409: "Conflict",
  410: "Gone",
  411: "Length Required",
  413: "Content Too Large",
  415: "Unsupported Media Type",
  417: "Expectation Failed",
  422: "Unprocessable Content",
  423: "Locked",
  429: "Too Many Requests",
  431: "Request Header Fields Too Large",
  499: "Client Closed Request",
  500: "Internal Server Error",
  501: "Not Implemented",
  503: "Service Unavailable",
  504: "Gateway Timeout",
  505: "HTTP Version Not Supported",
  507: "Insufficient Storage",
};

/** Pieces up to this size are gathered with the head into one write. */
const GATHER_BYTES = 16 * 1024;

/** Fields this server sets itself; a Response's own values for them are not sent. */
const OWN_FIELDS = new Set([
  "connection",
  "content-length",
  "transfer-encoding",
  "keep-alive",
  "date",
]);

let dateSecond = -1;
let dateValue = "";

/** The Date field's value, made once a second. */
function httpDate(): string {
  const now = Date.now();
  const s = Math.floor(now / 1000);
  if (s !== dateSecond) {
    dateSecond = s;
    dateValue = new Date(now).toUTCString();
  }
  return dateValue;
}

const encoder = new TextEncoder();

/** Writes all of `bytes`. */
export async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let at = 0;
  while (at < bytes.byteLength) at += await conn.write(bytes.subarray(at));
}

/** A status's body is empty by definition (1xx, 204, 304). */
function bodiless(status: number): boolean {
  return status < 200 || status === 204 || status === 304;
}

/** How the answer is to be sent. */
export interface WriteOptions {
  /** The request was HEAD: fields only. */
  head: boolean;
  /** Close the connection after this answer (says `Connection: close`). */
  close: boolean;
  /** An HTTP/1.0 request that asked to keep the connection: say `Connection: keep-alive`. */
  keepAlive10?: boolean;
}

/**
 * Writes `res` to `conn`. Resolves once every byte was handed to the socket; rejects when the
 * connection fails (the caller closes it).
 */
export async function writeResponse(
  conn: Deno.Conn,
  res: Response,
  o: WriteOptions,
): Promise<void> {
  const parts = bodyPartsOf(res);
  const declared = res.headers.get("content-length");
  let body: Uint8Array[] | null = null;
  let stream: ReadableStream<Uint8Array> | null = null;
  let length = 0;
  if (o.head || bodiless(res.status)) {
    await res.body?.cancel().catch(() => {});
  } else if (parts) {
    body = parts;
    length = parts.reduce((n, p) => n + p.byteLength, 0);
  } else if (res.body === null) {
    body = [];
  } else if (declared !== null && /^\d+$/.test(declared)) {
    stream = res.body;
    length = Number(declared);
  } else {
    const all = await res.bytes();
    body = [all];
    length = all.byteLength;
  }
  let head = `HTTP/1.1 ${res.status} ${REASONS[res.status] ?? "Status"}\r\ndate: ${httpDate()}\r\n`;
  res.headers.forEach((v, k) => {
    if (!OWN_FIELDS.has(k)) head += `${k}: ${v}\r\n`;
  });
  if (o.head) {
    if (declared !== null) head += `content-length: ${declared}\r\n`;
  } else if (!bodiless(res.status)) head += `content-length: ${length}\r\n`;
  if (o.close) head += "connection: close\r\n";
  else if (o.keepAlive10) head += "connection: keep-alive\r\n";
  head += "\r\n";
  const done = stream
    ? writeStream(conn, encoder.encode(head), stream, length)
    : writeParts(conn, encoder.encode(head), body ?? []);
  if (parts) releaseWhenDelivered(res, done);
  await done;
}

/** The head and the parts, small neighbours gathered into one write. */
async function writeParts(conn: Deno.Conn, head: Uint8Array, parts: Uint8Array[]): Promise<void> {
  let gathered: Uint8Array[] = [head];
  let gatheredBytes = head.byteLength;
  const flush = async () => {
    if (gathered.length === 0) return;
    if (gathered.length === 1) await writeAll(conn, gathered[0]);
    else {
      const one = new Uint8Array(gatheredBytes);
      let at = 0;
      for (const g of gathered) {
        one.set(g, at);
        at += g.byteLength;
      }
      await writeAll(conn, one);
    }
    gathered = [];
    gatheredBytes = 0;
  };
  for (const p of parts) {
    if (p.byteLength === 0) continue;
    if (p.byteLength <= GATHER_BYTES && gatheredBytes + p.byteLength <= 4 * GATHER_BYTES) {
      gathered.push(p);
      gatheredBytes += p.byteLength;
      continue;
    }
    if (p.byteLength > GATHER_BYTES) {
      // Head and small pieces go first, then the large one as it is.
      await flush();
      await writeAll(conn, p);
      continue;
    }
    await flush();
    gathered.push(p);
    gatheredBytes = p.byteLength;
  }
  await flush();
}

/** The head, then a body stream of declared `length` (cut or failed: the caller closes). */
async function writeStream(
  conn: Deno.Conn,
  head: Uint8Array,
  stream: ReadableStream<Uint8Array>,
  length: number,
): Promise<void> {
  await writeAll(conn, head);
  let sent = 0;
  const reader = stream.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      sent += value.byteLength;
      if (sent > length) throw new Error(`answer body runs past its Content-Length ${length}`);
      await writeAll(conn, value);
    }
  } finally {
    reader.releaseLock();
  }
  if (sent !== length) throw new Error(`answer body ended at ${sent} of ${length} bytes`);
}
