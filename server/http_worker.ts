/**
 * One HTTP worker thread of the worker front (worker_front.ts): it serves the port with
 * `Deno.serve` (`reusePort`: the kernel spreads connections over the workers), posts each
 * request's head to the thread that owns the service at once, reads the body into one buffer
 * (a safetensors body of declared length in one piece) and posts it, transferred, then answers with the status, headers and body the owner posts
 * back (transferred too). It reads no body past the general limit (`maxBodyBytes`): a declared
 * length over it, or a request the access check refuses, is not read at all (no route would
 * read it); a stream that runs over stops there. A client that goes away is passed on (its
 * request's signal aborts on the owner's side). An answer that is not well formed is a 500.
 * @module
 */
import { accessCheck } from "./auth.ts";
import { contentLength, streamBody, wholeBody } from "./body_read.ts";
import { mediaType } from "./body.ts";
import { SAFETENSORS } from "./responses.ts";
import { problemResponse, toProblem } from "./problem.ts";
import {
  type BodyMessage,
  checkResponse,
  type FromWorker,
  type ResponseMessage,
  type WorkerInit,
} from "./worker_protocol.ts";

interface WorkerScope {
  postMessage(m: FromWorker, transfer?: Transferable[]): void;
  onmessage: ((e: MessageEvent) => void) | null;
}
const scope = globalThis as unknown as WorkerScope;

const waiting = new Map<number, (m: ResponseMessage | string) => void>();
let nextId = 0;
let server: Deno.HttpServer | null = null;

/** The bytes as one ArrayBuffer of their exact length (copied only when they are a view). */
function ownBuffer(b: Uint8Array): ArrayBuffer {
  const whole = b.byteOffset === 0 && b.byteLength === b.buffer.byteLength;
  return whole && b.buffer instanceof ArrayBuffer ? b.buffer : b.slice().buffer;
}

/**
 * Reads the body and posts it: a safetensors body of declared length in one piece
 * (body_read.ts's wholeBody, as the forward route reads it without workers), any other with
 * streamBody (the limit counted per chunk; the chunk that runs over is kept, so the owner sees
 * more than any route's limit).
 */
async function postBody(req: Request, id: number, declared: number, limit: number) {
  const whole = declared >= 0 && mediaType(req.headers.get("content-type")) === SAFETENSORS;
  const read = whole ? await wholeBody(req) : await streamBody(req.body!, declared, limit);
  const bytes = ownBuffer(read.bytes);
  const message = read.cause instanceof Error ? read.cause.message : undefined;
  const m: BodyMessage = {
    type: "body",
    id,
    bytes,
    end: read.end,
    ...(message ? { message } : {}),
    ...(read.uncounted ? { uncounted: true } : {}),
  };
  scope.postMessage(m, [bytes]);
}

/** Serves one request through the owner. */
async function serve(req: Request, init: WorkerInit, allowed: (req: Request) => boolean) {
  const id = nextId++;
  const answer = new Promise<ResponseMessage | string>((r) => waiting.set(id, r));
  const method = req.method.toUpperCase();
  // A declared length says so without `req.body`, whose stream would make `req.bytes()` read
  // chunk by chunk (body_read.ts wholeBody).
  const hasBody = method !== "GET" && method !== "HEAD" &&
    (contentLength(req.headers.get("content-length")) > 0 || req.body !== null);
  scope.postMessage({
    type: "head",
    id,
    method: req.method,
    url: req.url,
    headers: [...req.headers],
    hasBody,
  });
  const onAbort = () => scope.postMessage({ type: "abort", id });
  req.signal.addEventListener("abort", onAbort, { once: true });
  if (hasBody) {
    const length = contentLength(req.headers.get("content-length"));
    const declared = Number.isNaN(length) ? -1 : length; // the owner names a bad one
    if (declared > init.maxBodyBytes || !allowed(req)) {
      const bytes = new ArrayBuffer(0);
      scope.postMessage({ type: "body", id, bytes, end: "skipped" }, [bytes]);
    } else {
      void postBody(req, id, declared, init.maxBodyBytes);
    }
  }
  const r = await answer;
  req.signal.removeEventListener("abort", onAbort);
  if (typeof r === "string") {
    return problemResponse(toProblem(new Error(`malformed answer from the service: ${r}`)));
  }
  return new Response(r.body, { status: r.status, headers: r.headers });
}

function start(init: WorkerInit): void {
  const check = accessCheck(init.access);
  const allowed = (req: Request) => {
    try {
      check(req, new URL(req.url));
      return true;
    } catch {
      return false;
    }
  };
  server = Deno.serve({
    port: init.port,
    hostname: init.hostname,
    reusePort: true,
    onListen: ({ hostname, port }) => scope.postMessage({ type: "listening", hostname, port }),
  }, (req) => serve(req, init, allowed));
}

scope.onmessage = (e: MessageEvent) => {
  const m = e.data as { type?: unknown; id?: unknown } | null;
  if (m?.type === "init") return start(m as WorkerInit);
  if (m?.type === "shutdown") {
    void (server?.shutdown() ?? Promise.resolve()).then(() =>
      scope.postMessage({ type: "closed" })
    );
    return;
  }
  if (m?.type === "fault") throw new Error("fault injected by the service thread (a test hook)");
  const r = checkResponse(m);
  const id = typeof r === "string" ? m?.id : r.id;
  const resolve = typeof id === "number" ? waiting.get(id) : undefined;
  if (resolve === undefined) {
    console.error(
      `http worker: an answer for no waiting request: ${typeof r === "string" ? r : id}`,
    );
    return;
  }
  waiting.delete(id as number);
  resolve(r);
};
