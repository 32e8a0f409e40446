/**
 * The HTTP front of N worker threads (`--http-workers N`): each worker (http_worker.ts) serves
 * the same port with `reusePort` and does the HTTP work (connections, parsing, reading the
 * body into one buffer, writing the answer); this thread, which owns the WebGPU device and the
 * service, runs the same pure handler as the single-threaded server on a Request rebuilt from
 * the worker's messages (body transferred, not copied) and posts the answer back. The
 * handler sees what it sees under Deno.serve: the method, URL and headers, a body stream (one
 * chunk) that ends as the client's did, and a signal that aborts when the client goes away.
 *
 * A worker that crashes is logged and replaced; the calls it carried are aborted (their
 * clients lost the connection with it). A message that is not well formed is logged as a
 * server fault and, where a request waits on it, answered with a 500.
 * @module
 */
import type { AccessPolicy } from "./auth.ts";
import { type ErrorLogger, problemResponse, toProblem } from "./problem.ts";
import { releaseWhenDelivered, serveLentBodies } from "./lent_body.ts";
import { setPreReadBody, type StreamedBody } from "./body_read.ts";
import {
  type BodyMessage,
  checkFromWorker,
  type HeadMessage,
  type ResponseMessage,
  type ToWorker,
  type WorkerInit,
} from "./worker_protocol.ts";

/** Options of {@link serveWithWorkers}. */
export interface WorkerFrontOptions {
  /** Worker threads (at least 1). */
  workers: number;
  /** Port to listen on (0: any free one, the same for every worker). */
  port: number;
  hostname: string;
  /** The handler's access policy (workers skip the bodies of requests it refuses). */
  access: AccessPolicy;
  /** The general body limit (`--max-body-bytes`): workers read no body past it. */
  maxBodyBytes: number;
  /** Called once every worker listens. */
  onListen?: (addr: { hostname: string; port: number }) => void;
  /** Logs server faults (default console.error). */
  log?: ErrorLogger;
}

/** A running worker front: what main.ts and the drainer need of a server. */
export interface WorkerFront {
  readonly addr: { hostname: string; port: number };
  /** Stops taking connections, lets the workers send the answers in flight, ends them. */
  shutdown(): Promise<void>;
  /** Resolves once shut down. */
  readonly finished: Promise<void>;
  /** Live worker threads. */
  readonly workers: number;
  /** Makes worker `i` crash (tests use it to exercise recovery). */
  fault(i: number): void;
}

type Handler = (req: Request) => Promise<Response>;

const BODYLESS = new Set(["GET", "HEAD"]);

/** One in-flight request on this side. */
interface Pending {
  abort: AbortController;
  body: Promise<BodyMessage>;
  gotBody: (m: BodyMessage) => void;
}

/** A body stream of one chunk that ends as the worker's read did. */
function bodyStream(p: Pending): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    async pull(c) {
      const m = await p.body;
      if (m.bytes.byteLength > 0) c.enqueue(new Uint8Array(m.bytes));
      if (m.end === "error") c.error(m.message !== undefined ? new Error(m.message) : undefined);
      else c.close();
    },
  });
}

/** The Request the handler gets (a method `new Request` refuses, e.g. TRACE, is kept as sent). */
function rebuild(m: HeadMessage, p: Pending): Request {
  const body = m.hasBody && !BODYLESS.has(m.method.toUpperCase()) ? bodyStream(p) : null;
  const init = { headers: m.headers, body, signal: p.abort.signal };
  let req: Request;
  try {
    req = new Request(m.url, { ...init, method: m.method });
  } catch (e) {
    if (!(e instanceof TypeError) || !/forbidden/i.test(e.message)) throw e;
    req = new Request(m.url, { ...init, method: "POST" });
    Object.defineProperty(req, "method", { value: m.method });
  }
  if (body !== null) setPreReadBody(req, p.body.then(preRead));
  return req;
}

/** The worker's read as readBody takes it: the transferred bytes as they are, no stream. */
function preRead(m: BodyMessage): StreamedBody {
  const cause = m.message !== undefined ? new Error(m.message) : undefined;
  const end = m.end === "skipped" ? "error" : m.end;
  return { bytes: new Uint8Array(m.bytes), end, cause, uncounted: m.uncounted };
}

/** One worker thread and the requests it carries. */
class Lane {
  readonly worker: Worker;
  readonly pending = new Map<number, Pending>();
  closed = Promise.withResolvers<void>();
  listening = Promise.withResolvers<{ hostname: string; port: number }>();

  constructor(
    init: WorkerInit,
    private handler: Handler,
    private log: ErrorLogger,
    private onCrash: (lane: Lane, e: ErrorEvent) => void,
  ) {
    this.worker = new Worker(new URL("./http_worker.ts", import.meta.url), { type: "module" });
    this.worker.onmessage = (e) => this.#receive(e.data);
    this.worker.onerror = (e) => {
      e.preventDefault();
      this.listening.reject(new Error(e.message));
      this.closed.resolve();
      this.#failAll();
      this.onCrash(this, e);
    };
    this.post(init);
  }

  post(m: ToWorker, transfer: Transferable[] = []): void {
    this.worker.postMessage(m, transfer);
  }

  #receive(data: unknown): void {
    const m = checkFromWorker(data);
    if (typeof m === "string") {
      this.log("http worker sent a malformed message", new Error(m));
      const id = (data as { id?: unknown } | null)?.id;
      if (typeof id === "number" && (data as { type?: unknown }).type === "head") {
        this.pending.set(id, {
          abort: new AbortController(),
          body: new Promise(() => {}),
          gotBody() {},
        });
        this.#answer(id, problemResponse(toProblem(new Error(m), undefined, () => {})));
      }
      return;
    }
    switch (m.type) {
      case "head":
        return this.#head(m);
      case "body":
        return this.pending.get(m.id)?.gotBody(m);
      case "abort":
        return this.pending.get(m.id)?.abort.abort();
      case "listening":
        return this.listening.resolve({ hostname: m.hostname, port: m.port });
      case "closed":
        return this.closed.resolve();
    }
  }

  #head(m: HeadMessage): void {
    const body = Promise.withResolvers<BodyMessage>();
    const p: Pending = { abort: new AbortController(), body: body.promise, gotBody: body.resolve };
    this.pending.set(m.id, p);
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

  async #answer(id: number, res: Response): Promise<void> {
    let body: ArrayBuffer | null = null;
    try {
      const copy = res.body === null ? Promise.resolve(null) : res.arrayBuffer();
      releaseWhenDelivered(res, copy); // a lent body's memory goes back once copied
      body = await copy;
    } catch (e) {
      res = problemResponse(toProblem(e, undefined, this.log));
      body = await res.arrayBuffer();
    }
    if (!this.pending.delete(id)) return;
    const m: ResponseMessage = {
      type: "response",
      id,
      status: res.status,
      headers: [...res.headers],
      body,
    };
    this.post(m, body ? [body] : []);
  }

  /** The worker is gone: its calls' clients are too. */
  #failAll(): void {
    for (const p of this.pending.values()) {
      p.abort.abort();
      p.gotBody({
        type: "body",
        id: -1,
        bytes: new ArrayBuffer(0),
        end: "error",
        message: "the http worker stopped",
      });
    }
    this.pending.clear();
  }
}

/**
 * Starts `opts.workers` HTTP workers on one port, each passing its requests to `handler` on
 * this thread. Rejects (with the worker's reason) when one cannot listen.
 */
export async function serveWithWorkers(
  opts: WorkerFrontOptions,
  handler: Handler,
): Promise<WorkerFront> {
  if (!Number.isInteger(opts.workers) || opts.workers < 1) {
    throw new Error(`workers must be an integer >= 1, got ${opts.workers}`);
  }
  const log = opts.log ?? ((msg, e) => console.error(msg, e));
  // Holding the port while the workers bind it keeps port 0 one port for all of them.
  const hold = Deno.listen({ port: opts.port, hostname: opts.hostname, reusePort: true });
  const port = (hold.addr as Deno.NetAddr).port;
  const init: WorkerInit = {
    type: "init",
    port,
    hostname: opts.hostname,
    access: opts.access,
    maxBodyBytes: opts.maxBodyBytes,
  };
  let stopping = false;
  const lanes: Lane[] = [];
  const onCrash = (lane: Lane, e: ErrorEvent) => {
    const i = lanes.indexOf(lane);
    if (i < 0) return;
    log(`http worker ${i} crashed: ${e.message}`, e.error);
    if (stopping) return;
    lanes[i] = new Lane(init, handler, log, onCrash);
    lanes[i].listening.promise.catch(() => {});
  };
  for (let i = 0; i < opts.workers; i++) lanes.push(new Lane(init, handler, log, onCrash));
  let addr: { hostname: string; port: number };
  try {
    addr = (await Promise.all(lanes.map((l) => l.listening.promise)))[0];
  } catch (e) {
    stopping = true;
    lanes.forEach((l) => l.worker.terminate());
    throw e;
  } finally {
    hold.close();
  }
  opts.onListen?.(addr);
  const finished = Promise.withResolvers<void>();
  let shut: Promise<void> | null = null;
  return {
    addr,
    finished: finished.promise,
    get workers() {
      return lanes.length;
    },
    fault(i: number) {
      lanes[i].post({ type: "fault" });
    },
    shutdown() {
      shut ??= (async () => {
        stopping = true;
        lanes.forEach((l) => l.post({ type: "shutdown" }));
        await Promise.all(lanes.map((l) => l.closed.promise));
        lanes.forEach((l) => l.worker.terminate());
        finished.resolve();
      })();
      return shut;
    },
  };
}

/** A server of either kind, as main.ts, the tests' servers and the benches use it. */
export type HttpServer = Pick<WorkerFront, "addr" | "shutdown" | "finished">;

/**
 * Serves `handler` on this thread when `opts.workers` is 0 (Deno.serve; lent answer bodies
 * are released once Deno delivered them), else through that many HTTP worker threads.
 */
export async function serveHttp(opts: WorkerFrontOptions, handler: Handler): Promise<HttpServer> {
  if (opts.workers > 0) return await serveWithWorkers(opts, handler);
  const s = Deno.serve(
    { port: opts.port, hostname: opts.hostname, onListen: opts.onListen ?? (() => {}) },
    serveLentBodies(handler),
  );
  return { addr: s.addr as Deno.NetAddr, shutdown: () => s.shutdown(), finished: s.finished };
}
