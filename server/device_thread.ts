/**
 * One device thread (`--device-threads N`, device_threads.ts): a worker that owns a WebGPU
 * device of its own (its own runtime instance, Dawn or Deno's), a service over it (caches,
 * plans, backends) and the same pure handler as the single-threaded server, fed by the main
 * thread through a RequestOwner (request_owner.ts). Several of them let calls on different
 * caches run side by side: each thread's host work and completion waits are its own.
 *
 * Messages: the main thread posts `device-init` ({@link DeviceThreadInit}), then the request
 * messages of worker_protocol.ts, then `device-close`; this thread answers `device-ready`
 * (or why its device cannot start), the responses, and `device-closed` once its service and
 * device are closed. Under `--device-threads-http` the main thread also posts `http-listen`
 * ({@link HttpListenMessage}: the thread serves the port itself, thread_http.ts; answered by
 * `http-listening` or `http-failed`) and, on shutdown, `http-drain` (answered by `http-drained`
 * with what the thread's drainer did). The front pings it (`device-ping`, answered `device-pong`
 * at once: thread_watchdog.ts); tests make it fail through the front's hooks (`control` below).
 * @module
 */
import { lineLogger } from "./problem.ts";
import { bodyLimits } from "./body.ts";
import { bodyReader } from "./head_refusal.ts";
import { RequestSender } from "./request_sender.ts";
import { serveThreadHttp } from "./thread_http.ts";
import { scanWorker } from "./forward_cache_id.ts";
import { Drainer } from "./shutdown.ts";
import type { ResilientServer } from "./serve_resilient.ts";
import { named } from "./responses.ts";
import type { KeepWarmOptions } from "../gpu/keep_warm.ts";
import type { RuntimeOptions } from "../gpu/runtime_options.ts";
import { acquireDevice, serviceAndHandler, type ServingOptions } from "./device_setup.ts";
import { sharedJsonDecoder } from "./json_decoder.ts";
import { RequestOwner } from "./request_owner.ts";
import { checkFromWorker, type ResponseMessage } from "./worker_protocol.ts";
import { useStderrLock } from "../gpu/runtime_stderr.ts";

/** What one device thread serves with (structured-cloneable; `memoryBudgetBytes`: its share). */
export interface DeviceThreadInit extends ServingOptions {
  type: "device-init";
  index: number;
  gpu: boolean;
  runtime: RuntimeOptions;
  /** Keep-warm (thread 0 only: the GPU's clock is the card's). */
  keepWarm?: KeepWarmOptions;
  /** The process's stderr-capture lock (gpu/runtime_stderr.ts), shared by every thread. */
  stderrLock: SharedArrayBuffer;
  /**
   * `[0]`: the calls this thread's handler is running, `[1]`: those it finished, kept here for
   * the front's watchdog (thread_watchdog.ts: a thread at work, which may hold its JS thread for
   * a whole GPU wait on Deno's runtime, is not lost for its silence; one that finishes no call
   * for `ATTN_THREAD_STUCK_MS` is).
   */
  working: Int32Array;
}

/** `--device-threads-http`: serve `port` here, passing what is not this thread's to `front`. */
export interface HttpListenMessage {
  type: "http-listen";
  port: number;
  hostname: string;
  /** The front's token for thread_http.ts ORIGIN_HEADER. */
  token: string;
  /** The front's end of the requests this thread passes on (worker_protocol.ts messages). */
  front: MessagePort;
  /** `[0]`: the calls this thread's listener is working on, kept here for the front to read. */
  calls: Int32Array;
}

/** What a thread's listener did: listening, failed (why), or drained (`http-drain`). */
export type HttpListenerMessage =
  | { type: "http-listening"; hostname: string; port: number }
  | { type: "http-failed"; reason: string }
  | { type: "http-drained"; drained: boolean; unfinished: number; refused: number };

/** A device thread's start: ready, or why not (`fatal`: an explicit runtime that cannot start). */
export type DeviceReadyMessage =
  | { type: "device-ready"; ok: true }
  | { type: "device-ready"; ok: false; reason: string; fatal: boolean };

interface Scope {
  postMessage(m: unknown, transfer?: Transferable[]): void;
  onmessage: ((e: MessageEvent) => void) | null;
  close(): void;
}
const scope = globalThis as unknown as Scope;

/** Thrown by the fatal hook: the start ends with this reason. */
class FatalStart extends Error {}

let owner: RequestOwner | null = null;
let close: (() => Promise<void>) | null = null;
let settings: DeviceThreadInit | null = null;
let serve: { handler: (req: Request) => Promise<Response>; holds: (id: string) => boolean } | null =
  null;
let listener: { server: ResilientServer; drainer: Drainer; close(): void } | null = null;

/**
 * `h`, counting in `calls[0]` the calls it is working on and in `calls[1]` those it finished
 * (memory shared with the front: its watchdog reads both, thread_watchdog.ts).
 */
function counted(
  calls: Int32Array,
  h: (req: Request) => Promise<Response>,
): (req: Request) => Promise<Response> {
  return async (req) => {
    Atomics.add(calls, 0, 1);
    try {
      return await h(req);
    } finally {
      Atomics.sub(calls, 0, 1);
      Atomics.add(calls, 1, 1);
    }
  };
}

/** `http-listen`: this thread serves the port too (thread_http.ts). */
function listen(m: HttpListenMessage): void {
  const init = settings, s = serve;
  if (!init || !s || listener) {
    scope.postMessage({ type: "http-failed", reason: "not ready to listen" });
    return;
  }
  const log = lineLogger(`device thread ${init.index}: `);
  const front = new RequestSender(
    (msg, t) => m.front.postMessage(msg, t ?? []),
    init.maxBodyBytes,
    bodyReader(init.access, bodyLimits(init.maxBodyBytes, init.maxJsonBodyBytes)),
    init.maxJsonBodyBytes,
  );
  m.front.onmessage = (e) => {
    const wrong = front.receive(e.data);
    if (wrong !== null) log(`the front: ${wrong}`, new Error(wrong));
  };
  const drainer = new Drainer();
  const scans = scanWorker();
  try {
    const server = serveThreadHttp({
      index: init.index,
      port: m.port,
      hostname: m.hostname,
      token: m.token,
      handler: s.handler,
      holds: s.holds,
      wrap: (h) => named(drainer.track(counted(m.calls, h)), init.instance),
      front,
      scans,
      onListen: ({ hostname, port }) =>
        scope.postMessage({ type: "http-listening", hostname, port }),
      log,
    });
    listener = { server, drainer, close: () => (scans.close(), m.front.close()) };
  } catch (e) {
    scans.close();
    scope.postMessage({ type: "http-failed", reason: e instanceof Error ? e.message : String(e) });
  }
}

/** `http-drain`: the listener's drain (shutdown.ts), then its answer. */
async function drain(deadlineMs: number): Promise<void> {
  const l = listener;
  if (!l) {
    return scope.postMessage({ type: "http-drained", drained: true, unfinished: 0, refused: 0 });
  }
  const r = await l.drainer.drain(l.server, { deadlineMs });
  l.close();
  listener = null;
  scope.postMessage({
    type: "http-drained",
    drained: r.drained,
    unfinished: r.unfinished,
    refused: r.refused,
  });
}

async function start(init: DeviceThreadInit): Promise<void> {
  useStderrLock(init.stderrLock);
  const say = (t: string) => console.error(`device thread ${init.index}: ${t}`);
  const { device, close: closeDevice } = await acquireDevice(
    init.gpu,
    init.runtime,
    init.keepWarm,
    {
      line: say,
      probeOthers: init.index === 0,
      fatal: (reason) => {
        throw new FatalStart(reason);
      },
    },
  );
  const log = lineLogger(`device thread ${init.index}: `);
  const { service, handler: own } = serviceAndHandler(device, init, log);
  // A worker started from this one answers its first message after about 1 s (Deno 2.9.6): the
  // CPU_REFERENCE pool and the JSON decoder start theirs now and keep them through idle-outs.
  service.prewarm();
  sharedJsonDecoder.keepWarm();
  const handler = counted(init.working, own);
  settings = init;
  serve = { handler, holds: (id) => service.caches.peek(id) !== undefined };
  owner = new RequestOwner(
    (m: ResponseMessage, t: Transferable[]) => scope.postMessage(m, t),
    handler,
    log,
  );
  close = async () => {
    await service.close();
    sharedJsonDecoder.close();
    closeDevice();
  };
}

/**
 * The front's liveness ping (thread_watchdog.ts) and its test hooks: a ping is answered at once;
 * `device-fault` throws (an error event), `device-exit` ends this thread without one, and
 * `device-hang` blocks its JS thread for `ms`. Only the front posts these (an HTTP request
 * reaches this thread as worker_protocol.ts messages, never as one of these). True when `data`
 * was one of them.
 */
function control(data: { type?: unknown; seq?: unknown; ms?: unknown }): boolean {
  switch (data.type) {
    case "device-ping":
      scope.postMessage({ type: "device-pong", seq: data.seq });
      return true;
    case "device-fault":
      throw new Error("fault injected by the front (a test hook)");
    case "device-exit":
      scope.close();
      return true;
    case "device-hang":
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Number(data.ms) || 0);
      return true;
  }
  return false;
}

scope.onmessage = (e: MessageEvent) => {
  const data = e.data as { type?: unknown } | null;
  if (data && control(data)) return;
  if (data?.type === "device-init") {
    start(data as DeviceThreadInit).then(
      () => scope.postMessage({ type: "device-ready", ok: true }),
      (err) =>
        scope.postMessage({
          type: "device-ready",
          ok: false,
          reason: err instanceof Error ? err.message : String(err),
          fatal: err instanceof FatalStart,
        }),
    );
    return;
  }
  if (data?.type === "http-listen") return listen(data as HttpListenMessage);
  if (data?.type === "http-drain") {
    return void drain(Number((data as { deadlineMs?: unknown }).deadlineMs) || 0);
  }
  if (data?.type === "device-close") {
    const stopListening = listener ? listener.server.shutdown().then(listener.close) : null;
    listener = null;
    void (stopListening ?? Promise.resolve()).then(() => close?.()).finally(() =>
      scope.postMessage({ type: "device-closed" })
    );
    return;
  }
  const m = checkFromWorker(data);
  if (typeof m === "string") {
    const id = (data as { id?: unknown } | null)?.id;
    console.error(`device thread: a malformed message: ${m}`);
    if (typeof id === "number" && data?.type === "head") owner?.malformed(id, m);
    return;
  }
  if (m.type === "head") owner?.head(m);
  else if (m.type === "body") owner?.body(m);
  else if (m.type === "abort") owner?.abort(m.id);
};
