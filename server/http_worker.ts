/**
 * One HTTP worker thread of the worker front (worker_front.ts): it serves the port with
 * `Deno.serve`, kept serving by serve_resilient.ts, or with the service's own HTTP/1.1 server
 * (`--http-engine http1`: http1_server.ts, its own answers counted on the owner's thread;
 * either with `reusePort`: the kernel spreads connections over the workers), and hands each request to the thread that owns the service through a
 * RequestSender (request_sender.ts): the head at once, the body read into one buffer and
 * transferred, the owner's answer sent back. It reads no body past the general limit
 * (`maxBodyBytes`) and none of a request the access check refuses.
 * @module
 */
import { lineLogger } from "./problem.ts";
import { accessAllowed } from "./auth.ts";
import { RequestSender } from "./request_sender.ts";
import { type ResilientServer, serveResilient } from "./serve_resilient.ts";
import { serveHttp1 } from "./http1_server.ts";
import type { RequestCounts } from "./http1_refusals.ts";
import type { FromWorker, WorkerInit } from "./worker_protocol.ts";

interface WorkerScope {
  postMessage(m: FromWorker, transfer?: Transferable[]): void;
  onmessage: ((e: MessageEvent) => void) | null;
}
const scope = globalThis as unknown as WorkerScope;

let server: ResilientServer | null = null;
let sender: RequestSender | null = null;

function start(init: WorkerInit): void {
  const allowed = accessAllowed(init.access);
  const s = new RequestSender(
    (m, t) => scope.postMessage(m, t),
    init.maxBodyBytes,
    allowed,
    init.maxJsonBodyBytes,
  );
  sender = s;
  const common = {
    port: init.port,
    hostname: init.hostname,
    reusePort: true,
    onListen: ({ hostname, port }: { hostname: string; port: number }) =>
      scope.postMessage({ type: "listening", hostname, port }),
    log: lineLogger("http worker: "),
  };
  if (init.engine === "http1") {
    // The answers it gives itself are counted on the owner's thread, with the handler's.
    const metrics: RequestCounts = {
      recordRequest: (route, method, status, code) =>
        scope.postMessage({ type: "own_answer", route, method, status, code }),
    };
    const openConnections = init.openConnections && init.connectionSlot
      ? { words: new Int32Array(init.openConnections), slot: init.connectionSlot }
      : undefined;
    server = serveHttp1(
      { ...common, metrics, instance: init.instance, openConnections },
      (req) => s.send(req),
    );
    return;
  }
  // Kept serving when accepting fails (out of file descriptors): serve_resilient.ts.
  server = serveResilient(common, (req) => s.send(req));
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
  // receive() says what is wrong with a message, or null when it took it.
  const wrong = sender ? sender.receive(m) : "an answer before init";
  if (wrong !== null) console.error(`http worker: ${wrong}`);
};
