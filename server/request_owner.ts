/**
 * The side of a thread hop that runs the handler: a {@link RequestOwner} takes the head, body
 * and abort messages of requests another thread received (worker_protocol.ts), runs the pure
 * handler on a Request rebuilt from them (body transferred, not copied; a signal that aborts
 * when the client goes away) and posts each answer back, its body transferred. Used by the
 * HTTP worker front (worker_front.ts: the owner is the service's thread, the HTTP workers send),
 * by device threads (device_thread.ts: each device thread owns a service, the main thread
 * sends) and by the device threads' listeners' front (thread_listeners.ts: the main thread owns
 * the handler, each thread's listener sends). The handler sees what it sees under Deno.serve:
 * the method, URL and headers, a body stream (one chunk) that ends as the sender's read did.
 * @module
 */
import { type ErrorLogger, problemResponse, toProblem } from "./problem.ts";
import { claimLentAnswer, releaseWhenDelivered, takeLentBytes } from "./lent_body.ts";
import { setPreReadBody, type StreamedBody } from "./body_read.ts";
import { keepSentPath, markUnparsableUrl } from "./routes.ts";
import { keepRead, keepWait, receivedWait } from "./request_arrival.ts";
import type { BodyMessage, HeadMessage, ResponseMessage } from "./worker_protocol.ts";

type Handler = (req: Request) => Promise<Response>;

const BODYLESS = new Set(["GET", "HEAD"]);

/** One request in flight on this side. */
interface Pending {
  abort: AbortController;
  body: Promise<BodyMessage>;
  gotBody: (m: BodyMessage) => void;
  /** The body will not come: its read fails with this (the sender is gone). */
  noBody: (why: Error) => void;
}

/** A pending request's state: its body still to come (`body` settles once it has). */
function pending(): Pending {
  const body = Promise.withResolvers<BodyMessage>();
  body.promise.catch(() => {}); // a body that fails is the handler's to see, or no one's
  return {
    abort: new AbortController(),
    body: body.promise,
    gotBody: body.resolve,
    noBody: body.reject,
  };
}

/** A body stream of one chunk that ends as the sender's read did. */
function bodyStream(p: Pending): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    async pull(c) {
      const m = await p.body;
      if (m.bytes.byteLength > 0) c.enqueue(new Uint8Array(m.bytes));
      if (m.end === "error" || m.end === "timeout") {
        c.error(m.message !== undefined ? new Error(m.message) : undefined);
      } else c.close();
    },
  });
}

/** The sender's read as readBody takes it: the transferred bytes as they are, no stream. */
function preRead(m: BodyMessage): StreamedBody {
  const cause = m.message !== undefined ? new Error(m.message) : undefined;
  const end = m.end === "skipped" ? "error" : m.end;
  return {
    bytes: new Uint8Array(m.bytes),
    end,
    cause,
    uncounted: m.uncounted,
    timeout_ms: m.timeout_ms,
    waitedMs: m.waitedMs,
    readMs: m.readMs,
  };
}

/** The Request the handler gets (a method `new Request` refuses, e.g. TRACE, is kept as sent). */
function rebuild(m: HeadMessage, p: Pending): Request {
  const body = m.hasBody && !BODYLESS.has(m.method.toUpperCase()) ? bodyStream(p) : null;
  const init = { headers: m.headers, body, signal: p.abort.signal };
  // A URL no Request takes (a Host that is no authority) is answered 400 by the handler, as on
  // one thread: the Request gets a placeholder URL and a mark (server/routes.ts requestUrl).
  const url = URL.canParse(m.url) ? m.url : "http://unparsable.invalid/";
  let req: Request;
  try {
    req = new Request(url, { ...init, method: m.method });
  } catch (e) {
    if (!(e instanceof TypeError) || !/forbidden/i.test(e.message)) throw e;
    req = new Request(url, { ...init, method: "POST" });
    Object.defineProperty(req, "method", { value: m.method });
  }
  if (url !== m.url) markUnparsableUrl(req);
  claimLentAnswer(req); // its answer is copied for the sender, then released (#answer)
  if (body !== null) {
    const read = p.body.then((m) => {
      keepWait(req, m.waitedMs ?? 0);
      keepRead(req, m.readMs ?? 0);
      return preRead(m);
    });
    read.catch(() => {}); // a read that fails is the handler's to see, or no one's
    setPreReadBody(req, read);
  }
  keepSentPath(req, m.path ?? m.url, m.url);
  return req;
}

/** Runs the handler for requests received on another thread; see the module doc. */
export class RequestOwner {
  readonly #pending = new Map<number, Pending>();

  constructor(
    private readonly post: (m: ResponseMessage, transfer: Transferable[]) => void,
    private readonly handler: Handler,
    private readonly log: ErrorLogger,
  ) {}

  /** Requests in flight. */
  get size(): number {
    return this.#pending.size;
  }

  /** A request's head arrived: the handler starts on it (its body follows when it has one). */
  head(m: HeadMessage): void {
    const p = pending();
    this.#pending.set(m.id, p);
    let req: Request;
    try {
      req = rebuild(m, p);
    } catch (e) {
      return void this.#answer(m.id, problemResponse(toProblem(e, undefined, this.log)));
    }
    this.handler(req).then(
      (res) => this.#answer(m.id, res),
      (e) => this.#answer(m.id, problemResponse(toProblem(e, undefined, this.log))),
    );
  }

  /** A request's body arrived. */
  body(m: BodyMessage): void {
    // The hop's wait is measured now, as this thread reads the message.
    this.#pending.get(m.id)?.gotBody({ ...m, waitedMs: receivedWait(m.sentAt, m.waitedMs) });
  }

  /** The client of request `id` went away. */
  abort(id: number): void {
    this.#pending.get(id)?.abort.abort();
  }

  /** A head that was not well formed (`why`): request `id` gets a 500. */
  malformed(id: number, why: string): void {
    this.#pending.set(id, pending());
    this.#answer(id, problemResponse(toProblem(new Error(why), undefined, this.log)));
  }

  /**
   * The sender is gone: its requests' clients are too (their signals abort; answers made later
   * are dropped). A body still to come ends in error with `why` when it is a message (the
   * handler's read then fails as for a client gone mid-body), or, when it is an Error (a
   * problem), its read rejects with it, so the handler answers that problem at once instead of
   * working on (a device thread gone: thread_listeners.ts).
   */
  failAll(why: string | Error): void {
    const bytes = new ArrayBuffer(0);
    const ended: BodyMessage = { type: "body", id: -1, bytes, end: "error", message: String(why) };
    for (const p of this.#pending.values()) {
      p.abort.abort();
      if (why instanceof Error) p.noBody(why);
      else p.gotBody(ended);
    }
    this.#pending.clear();
  }

  async #answer(id: number, res: Response): Promise<void> {
    let body: ArrayBuffer | null = null;
    try {
      body = takeLentBytes(res);
      if (body === null && res.body !== null) {
        const copy = res.arrayBuffer();
        releaseWhenDelivered(res, copy); // a lent body's memory goes back once copied
        body = await copy;
      }
    } catch (e) {
      res = problemResponse(toProblem(e, undefined, this.log));
      body = await res.arrayBuffer();
    }
    if (!this.#pending.delete(id)) return;
    const m: ResponseMessage = {
      type: "response",
      id,
      status: res.status,
      headers: [...res.headers],
      body,
    };
    this.post(m, body ? [body] : []);
  }
}
