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
import { serveResilient } from "./serve_resilient.ts";
import { serveHttp1 } from "./http1_server.ts";
import type { RequestCounts } from "./http1_refusals.ts";
import type { HttpEngine } from "./serve_options.ts";
import type { AccessPolicy } from "./auth.ts";
import { type ErrorLogger, lineLogger } from "./problem.ts";
import { serveLentBodies } from "./lent_body.ts";
import { RequestOwner } from "./request_owner.ts";
import { checkFromWorker, type ToWorker, type WorkerInit } from "./worker_protocol.ts";

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
  /** JSON bodies' limit (`--max-json-body-bytes`): workers read no JSON body past it. */
  maxJsonBodyBytes?: number;
  /** Called once every worker listens. */
  onListen?: (addr: { hostname: string; port: number }) => void;
  /** Logs server faults (default console.error). */
  log?: ErrorLogger;
  /** The HTTP server each worker runs (default `deno`). */
  engine?: HttpEngine;
  /** Where the http1 workers' own answers are counted (the handler's metrics). */
  metrics?: RequestCounts;
  /** The instance name the http1 workers' own answers carry. */
  instance?: string;
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

/** One worker thread and the requests it carries. */
class Lane {
  readonly worker: Worker;
  readonly owner: RequestOwner;
  closed = Promise.withResolvers<void>();
  listening = Promise.withResolvers<{ hostname: string; port: number }>();

  constructor(
    init: WorkerInit,
    handler: Handler,
    private log: ErrorLogger,
    private onCrash: (lane: Lane, e: ErrorEvent) => void,
    private counts?: RequestCounts,
  ) {
    this.worker = new Worker(new URL("./http_worker.ts", import.meta.url), { type: "module" });
    this.owner = new RequestOwner((m, t) => this.post(m, t), handler, log);
    this.worker.onmessage = (e) => this.#receive(e.data);
    this.worker.onerror = (e) => {
      e.preventDefault();
      this.listening.reject(new Error(e.message));
      this.closed.resolve();
      this.owner.failAll("the http worker stopped");
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
        this.owner.malformed(id, m);
      }
      return;
    }
    switch (m.type) {
      case "head":
        return this.owner.head(m);
      case "body":
        return this.owner.body(m);
      case "abort":
        return this.owner.abort(m.id);
      case "listening":
        return this.listening.resolve({ hostname: m.hostname, port: m.port });
      case "closed":
        return this.closed.resolve();
      case "own_answer":
        return this.counts?.recordRequest(m.route, m.method, m.status, m.code);
    }
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
  const log = opts.log ?? lineLogger();
  // Holding the port while the workers bind it keeps port 0 one port for all of them.
  const hold = Deno.listen({ port: opts.port, hostname: opts.hostname, reusePort: true });
  const port = (hold.addr as Deno.NetAddr).port;
  const init: WorkerInit = {
    type: "init",
    port,
    hostname: opts.hostname,
    access: opts.access,
    maxBodyBytes: opts.maxBodyBytes,
    maxJsonBodyBytes: opts.maxJsonBodyBytes,
    engine: opts.engine,
    instance: opts.instance,
  };
  // The http1 servers' open connections: word 0 the port's (the cap is the port's), word i + 1
  // worker i's, taken back from the port's count when that worker dies.
  const open = opts.engine === "http1"
    ? new Int32Array(new SharedArrayBuffer(4 * (opts.workers + 1)))
    : null;
  const initOf = (i: number): WorkerInit =>
    open
      ? { ...init, openConnections: open.buffer as SharedArrayBuffer, connectionSlot: i + 1 }
      : init;
  let stopping = false;
  const lanes: Lane[] = [];
  const onCrash = (lane: Lane, e: ErrorEvent) => {
    const i = lanes.indexOf(lane);
    if (i < 0) return;
    log(`http worker ${i} crashed: ${e.message}`, e.error);
    if (open) Atomics.sub(open, 0, Atomics.exchange(open, i + 1, 0)); // its connections died with it
    if (stopping) return;
    lanes[i] = new Lane(initOf(i), handler, log, onCrash, opts.metrics);
    lanes[i].listening.promise.catch(() => {});
  };
  for (let i = 0; i < opts.workers; i++) {
    lanes.push(new Lane(initOf(i), handler, log, onCrash, opts.metrics));
  }
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
 * Serves `handler` on this thread when `opts.workers` is 0 (Deno.serve, kept serving through
 * accept failures: serve_resilient.ts; lent answer bodies are released once Deno delivered
 * them), else through that many HTTP worker threads. With `engine` "http1" (on this thread or
 * in each worker), the answers that server gives itself (refused heads, its timeouts and
 * connection cap) are counted in `metrics`: the handler's, or what counts the answers of the
 * thread it runs on; and they carry `instance` as the handler's answers do.
 */
export async function serveHttp(
  opts: WorkerFrontOptions,
  handler: Handler,
): Promise<HttpServer> {
  if (opts.workers > 0) return await serveWithWorkers(opts, handler);
  if (opts.engine === "http1") {
    return serveHttp1({
      port: opts.port,
      hostname: opts.hostname,
      onListen: opts.onListen ?? (() => {}),
      log: opts.log,
      metrics: opts.metrics,
      instance: opts.instance,
    }, handler);
  }
  return serveResilient({
    port: opts.port,
    hostname: opts.hostname,
    onListen: opts.onListen ?? (() => {}),
    log: opts.log,
  }, serveLentBodies(handler));
}
