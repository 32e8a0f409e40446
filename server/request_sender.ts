/**
 * The side of a thread hop that received the request (worker_protocol.ts): a
 * {@link RequestSender} posts a request's head at once, reads its body into one buffer (a
 * safetensors body of declared length in one piece, any other counted chunk by chunk) and
 * posts it, transferred, then answers with the status, headers and body the owner posts back
 * (transferred too). It reads no body past `maxBodyBytes`: a declared length over it, or a
 * request `allowed` refuses, is not read at all (no route would read it); a stream that runs
 * over stops there. A client that goes away is passed on (its request's signal aborts on the
 * owner's side). An answer that is not well formed is a 500. A request whose body another
 * thread read already (a RequestOwner's, passed on again: a device thread's listener sends to
 * the front, which sends to a device thread) has that read posted as it ended, not read again;
 * when that read fails (the thread that made it is gone: RequestOwner.failAll), the request is
 * answered with its failure at once, and the owner gets a body ended in error.
 * Used by the HTTP workers (http_worker.ts), the device threads' listeners (thread_http.ts) and
 * the device-thread front (device_threads.ts).
 * @module
 */
import {
  bodySourceOf,
  contentLength,
  preReadBody,
  streamBody,
  type StreamedBody,
  wholeBodyIfCheap,
} from "./body_read.ts";
import { type BodyLimits, bodyLimits, isJsonType, mediaType } from "./body.ts";
import { SAFETENSORS } from "./responses.ts";
import { hopStamp } from "./request_arrival.ts";
import { NOT_LOGGED, problemResponse, toProblem } from "./problem.ts";
import { sentPath, urlAsSent } from "./routes.ts";
import {
  type BodyMessage,
  checkResponse,
  type FromWorker,
  type ResponseMessage,
} from "./worker_protocol.ts";

/** The bytes as one ArrayBuffer of their exact length (copied only when they are a view). */
function ownBuffer(b: Uint8Array): ArrayBuffer {
  const whole = b.byteOffset === 0 && b.byteLength === b.buffer.byteLength;
  return whole && b.buffer instanceof ArrayBuffer ? b.buffer : b.slice().buffer;
}

/** Sends requests to the thread that owns the handler; see the module doc. */
export class RequestSender {
  readonly #waiting = new Map<number, (m: ResponseMessage | string | Error) => void>();
  #nextId = 0;

  constructor(
    private readonly post: (m: FromWorker, transfer?: Transferable[]) => void,
    private readonly maxBodyBytes: number,
    private readonly allowed: (req: Request) => boolean,
    /** JSON bodies' own limit (default `maxBodyBytes`; capped by it: body.ts bodyLimits). */
    maxJsonBodyBytes: number = maxBodyBytes,
  ) {
    this.#limits = bodyLimits(maxBodyBytes, maxJsonBodyBytes);
  }

  readonly #limits: BodyLimits;

  /** The most a route reads of `req`'s body: its kind's limit (JSON's, else the general). */
  #limit(req: Request): number {
    return this.#limits[isJsonType(mediaType(req.headers.get("content-type"))) ? "json" : "binary"]
      .bytes;
  }

  /** Requests waiting for their answer. */
  get size(): number {
    return this.#waiting.size;
  }

  /**
   * Reads `req`'s body as {@link send} would (null: not read, over the limit or refused, or no
   * body), for a caller that looks at it before choosing where to send (device_threads.ts).
   * Rejects when the read another thread made fails (RequestOwner.failAll: with its problem).
   */
  async readBody(req: Request): Promise<StreamedBody | null> {
    const b = this.#bodyPlan(req);
    if (!b.read) return null;
    const t0 = performance.now();
    const r = await this.#read(req, b.declared);
    return { ...r, readMs: (r.readMs ?? 0) + performance.now() - t0 };
  }

  /**
   * Sends `req` (its body as `preRead` says when given: what {@link readBody} returned; with
   * `extraHeaders` added to its head) and answers with what the owner posts back.
   */
  async send(
    req: Request,
    preRead?: StreamedBody | null,
    extraHeaders: [string, string][] = [],
  ): Promise<Response> {
    const id = this.#nextId++;
    const answer = new Promise<ResponseMessage | string | Error>((r) => this.#waiting.set(id, r));
    const failed = Promise.withResolvers<Error>();
    const { hasBody, declared, read } = this.#bodyPlan(req);
    this.post({
      type: "head",
      id,
      method: req.method,
      url: urlAsSent(req),
      path: sentPath(req), // as sent, not resolved (routes.ts)
      headers: [...req.headers, ...extraHeaders],
      hasBody,
    });
    const onAbort = () => this.post({ type: "abort", id });
    req.signal.addEventListener("abort", onAbort, { once: true });
    if (req.signal.aborted) onAbort(); // gone while its body was read before this (a front's read)
    if (hasBody) {
      if (!read) {
        const bytes = new ArrayBuffer(0);
        this.post({ type: "body", id, bytes, end: "skipped" }, [bytes]);
      } else if (preRead) {
        this.#postRead(id, preRead);
      } else {
        void this.#read(req, declared).then(
          (r) => this.#postRead(id, r),
          (e: unknown) => failed.resolve(this.#postFailedRead(id, e)),
        );
      }
    }
    // A failed read answers at once; the owner's answer, when it comes, goes to no one.
    const r = await Promise.race([answer, failed.promise]);
    req.signal.removeEventListener("abort", onAbort);
    if (r instanceof Error) return problemResponse(toProblem(r, undefined, NOT_LOGGED));
    if (typeof r === "string") {
      return problemResponse(toProblem(new Error(`malformed answer from the service: ${r}`)));
    }
    return new Response(r.body, { status: r.status, headers: r.headers });
  }

  /**
   * An answer from the owner: hands it to its request. Returns what was wrong when it names
   * no waiting request (a malformed answer with an id still answers that request, a 500).
   */
  receive(data: unknown): string | null {
    const r = checkResponse(data);
    const id = typeof r === "string" ? (data as { id?: unknown } | null)?.id : r.id;
    const resolve = typeof id === "number" ? this.#waiting.get(id) : undefined;
    if (resolve === undefined) {
      return `an answer for no waiting request: ${typeof r === "string" ? r : id}`;
    }
    this.#waiting.delete(id as number);
    resolve(r);
    return null;
  }

  /** The owner is gone: every waiting request is answered with `why` (a problem; not logged). */
  failAll(why: Error): void {
    for (const resolve of this.#waiting.values()) resolve(why);
    this.#waiting.clear();
  }

  /** Whether `req` has a body, its declared length, and whether it is to be read. */
  #bodyPlan(req: Request): { hasBody: boolean; declared: number; read: boolean } {
    const method = req.method.toUpperCase();
    // A declared length says so without `req.body`, whose stream would make `req.bytes()` read
    // chunk by chunk (body_read.ts wholeBody).
    const length = contentLength(req.headers.get("content-length"));
    const hasBody = method !== "GET" && method !== "HEAD" &&
      (length > 0 || req.body !== null || bodySourceOf(req) !== undefined);
    const declared = Number.isNaN(length) ? -1 : length; // the owner names a bad one
    const read = hasBody && declared <= this.#limit(req) && this.allowed(req);
    return { hasBody, declared, read };
  }

  /**
   * Reads the body: the read another thread made when there is one (body_read.ts preReadBody:
   * re-reading its one-chunk stream would end a timeout as an error, or time out here before
   * the other thread's read ends); else a safetensors body of declared length in one piece where
   * body_read.ts's wholeBodyIfCheap allows (as the forward route reads it without workers), any
   * other with streamBody (the limit counted per chunk; the chunk that runs over is kept, so the
   * owner sees more than any route's limit).
   */
  #read(req: Request, declared: number): Promise<StreamedBody> {
    const pre = preReadBody(req);
    if (pre !== undefined) return pre;
    const source = bodySourceOf(req); // the service's own HTTP/1.1 server (http1_server.ts)
    if (source !== undefined) return source(this.#limit(req), false); // posted on: not borrowed
    const whole = mediaType(req.headers.get("content-type")) === SAFETENSORS
      ? wholeBodyIfCheap(req, declared)
      : null;
    return whole ?? streamBody(req.body!, declared, this.#limit(req));
  }

  /**
   * Tells the owner that request `id`'s body read failed with `e` (a body ended in error, so
   * that its handler ends); returns `e` as the request's answer.
   */
  #postFailedRead(id: number, e: unknown): Error {
    const why = e instanceof Error ? e : new Error(String(e));
    const bytes = new ArrayBuffer(0);
    this.post({ type: "body", id, bytes, end: "error", message: why.message }, [bytes]);
    return why;
  }

  /** Posts a body as read, transferred, stamped (request_arrival.ts). */
  #postRead(id: number, read: StreamedBody): void {
    const bytes = ownBuffer(read.bytes);
    const message = read.cause instanceof Error ? read.cause.message : undefined;
    const m: BodyMessage = {
      type: "body",
      id,
      bytes,
      end: read.end,
      ...(message ? { message } : {}),
      ...(read.uncounted ? { uncounted: true } : {}),
      ...(read.timeout_ms !== undefined ? { timeout_ms: read.timeout_ms } : {}),
      ...(read.readMs !== undefined ? { readMs: read.readMs } : {}),
      sentAt: hopStamp(),
      waitedMs: read.waitedMs ?? 0,
    };
    this.post(m, [bytes]);
  }
}
