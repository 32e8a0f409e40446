/**
 * One request and its answer on a connection of the service's own HTTP/1.1 server
 * (http1_server.ts): the Request built from the head, its body read from the socket when the
 * handler asks (body_read.ts `setBodySource`), the answer written, and whether the connection
 * stays open (an unread body drained or the connection closed).
 * @module
 */
import { type ErrorLogger, problemResponse, toProblem } from "./problem.ts";
import { setBodySource, type StreamedBody } from "./body_read.ts";
import { bodyTimeoutMs } from "./body_timeout.ts";
import { keepSentPath, markUnparsableUrl } from "./routes.ts";
import type { RequestHead } from "./http1_head.ts";
import type { ConnReader } from "./http1_reader.ts";
import { giveBodyBuffer, POOLED_BODY_MAX, takeBodyBuffer } from "./http1_body_pool.ts";
import { writeAll, writeResponse } from "./http1_write.ts";
import { claimLentAnswer } from "./lent_body.ts";
import { trace } from "../core/trace.ts";
import { linger, type OwnAnswers, refuseHead } from "./http1_refusals.ts";

/** An unread body up to this is read and dropped to keep the connection; a larger one closes it. */
const DRAIN_MAX = 256 * 1024;

/** Case variants of the methods Request would silently upper-case (Fetch's normalization). */
const NORMALIZED = new Set(["DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT"]);

export type Handler = (req: Request) => Promise<Response>;

/** What the connections of one server share. */
export interface Shared {
  handler: Handler;
  limits: { idleMs: number; headMs: number };
  stopping: () => boolean;
  log: ErrorLogger;
  /** How the answers the server gives itself are counted and named. */
  own: OwnAnswers;
}

/** The Request for a head (on a placeholder URL, marked, when no URL can be built from it). */
function requestOf(head: RequestHead, signal: AbortSignal): Request {
  const init = { method: head.method, headers: head.headers, signal };
  const absolute = /^[a-zA-Z][a-zA-Z0-9+.-]*:\/\//.test(head.target);
  const url = absolute
    ? head.target
    : `http://${head.host ?? "localhost"}${head.target === "*" ? "/*" : head.target}`;
  let req: Request;
  try {
    req = new Request(url, init);
  } catch {
    req = new Request("http://invalid.invalid/", init);
    markUnparsableUrl(req);
  }
  // Request resolves dot segments: routes see the target as sent, and a thread it is passed on
  // to gets the URL as built here (routes.ts urlAsSent).
  keepSentPath(req, head.target, url);
  return req;
}

/**
 * One request and its answer; whether the connection stays open. With `ATTN_TRACE_FILE` each
 * request's head, body and answer are traced with connection `id` (core/trace.ts), to tell what a
 * call waited on.
 */
export async function exchange(
  r: ConnReader,
  head: RequestHead,
  s: Shared,
  id: number,
): Promise<boolean> {
  trace(`http1 c${id}: head ${head.method} ${head.target}`);
  const { conn } = r;
  const { handler, stopping, log } = s;
  const notServed = async (why: string) => {
    await refuseHead(
      r,
      {
        status: 501,
        code: "method_not_implemented",
        detail: `method ${head.method} is not served${why}`,
        extra: { method: head.method },
      },
      head.method,
      s.own,
    );
    return false;
  };
  const upper = head.method.toUpperCase();
  if (upper !== head.method && NORMALIZED.has(upper)) {
    return await notServed(` (methods are case-sensitive: ${upper} is)`);
  }
  const ac = new AbortController();
  let req: Request;
  try {
    req = requestOf(head, ac.signal);
    claimLentAnswer(req); // writeResponse releases a lent answer once it was written
  } catch {
    return await notServed(""); // a method Request refuses (TRACE, CONNECT, TRACK)
  }
  const hasBody = head.chunked || head.contentLength > 0;
  let bodyRead: Promise<StreamedBody> | null = null;
  let bodyDone = !hasBody;
  let watching = false;
  let over = false;
  const watch = () => { // a read that ends in EOF: the client went away
    if (watching || over) return;
    const p = r.probe();
    if (!p) return;
    watching = true;
    p.then((x) => {
      watching = false;
      if (x === "eof") ac.abort(new Error("the client closed the connection"));
      else watch();
    });
  };
  let lease: ArrayBuffer | null = null; // a pooled buffer a borrowed body was read into
  if (hasBody) {
    setBodySource(req, (limit, borrow) => {
      bodyRead ??= (async () => {
        if (head.expectContinue) await writeAll(conn, CONTINUE);
        const gap = bodyTimeoutMs();
        const n = head.contentLength;
        if (borrow && !head.chunked && n <= POOLED_BODY_MAX && n <= limit) {
          lease = takeBodyBuffer(n);
        }
        const b = head.chunked
          ? await r.chunkedBody(limit, gap)
          : await r.lengthBody(n, limit, gap, lease ?? undefined);
        if (b.end !== "complete") lease = null; // a read cut short may still be writing into it
        bodyDone = b.end === "complete";
        trace(`http1 c${id}: body ${b.end}`);
        if (bodyDone) watch();
        return b;
      })();
      return bodyRead;
    });
  } else watch();
  let res: Response;
  try {
    res = await handler(req);
  } catch (e) {
    res = problemResponse(toProblem(e, undefined, log));
  }
  if (bodyRead) await (bodyRead as Promise<StreamedBody>).catch(() => {});
  over = true;
  // A body the handler did not read: a small one of declared length is read and dropped after
  // the answer (the connection kept), any other closes the connection.
  // (Not one that waits for a 100 Continue it never got: its client may never send it.)
  const drain = !bodyDone && bodyRead === null && !head.chunked && !head.expectContinue &&
    head.contentLength <= DRAIN_MAX;
  const close = !head.keepAlive || stopping() || (!bodyDone && !drain) || r.broken || r.eof ||
    res.headers.get("connection")?.toLowerCase() === "close";
  await writeResponse(conn, res, {
    head: head.method === "HEAD",
    close,
    keepAlive10: !close && head.minor === 0,
  });
  trace(`http1 c${id}: answer ${res.status} written`);
  if (lease) giveBodyBuffer(lease); // the answer is built and written: the body is given up
  if (close && !bodyDone && !r.eof && !r.broken) await linger(r);
  if (close || !drain) return !close;
  return (await r.lengthBody(head.contentLength, DRAIN_MAX, bodyTimeoutMs())).end === "complete";
}

const CONTINUE = new TextEncoder().encode("HTTP/1.1 100 Continue\r\n\r\n");
