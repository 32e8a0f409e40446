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
 * device are closed.
 * @module
 */
import { lineLogger } from "./problem.ts";
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
}

/** A device thread's start: ready, or why not (`fatal`: an explicit runtime that cannot start). */
export type DeviceReadyMessage =
  | { type: "device-ready"; ok: true }
  | { type: "device-ready"; ok: false; reason: string; fatal: boolean };

interface Scope {
  postMessage(m: unknown, transfer?: Transferable[]): void;
  onmessage: ((e: MessageEvent) => void) | null;
}
const scope = globalThis as unknown as Scope;

/** Thrown by the fatal hook: the start ends with this reason. */
class FatalStart extends Error {}

let owner: RequestOwner | null = null;
let close: (() => Promise<void>) | null = null;

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
  const { service, handler } = serviceAndHandler(device, init, log);
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

scope.onmessage = (e: MessageEvent) => {
  const data = e.data as { type?: unknown } | null;
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
  if (data?.type === "device-fault") throw new Error("fault injected by the front (a test hook)");
  if (data?.type === "device-close") {
    void (close?.() ?? Promise.resolve()).finally(() =>
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
