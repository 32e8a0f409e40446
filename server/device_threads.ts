/**
 * The device-thread front (`--device-threads N`): N worker threads (device_thread.ts), each
 * with its own WebGPU device and service, behind one handler on this thread, which does the
 * HTTP work and sends each request to a thread (request_sender.ts), so calls on caches of
 * different threads run side by side (one device-owning thread was issue 7's throughput limit).
 *
 * Where a request goes: a cache's routes (`/v1/kv-caches/{id}` and below) to the thread that
 * holds the cache (recorded when it was created: `POST /v1/kv-caches` on the thread holding the
 * fewest caches, `PUT /v1/kv-caches/{id}` of a new id likewise); `POST /v1/attention/forward`
 * to the holder of the cache its body names (server/forward_cache_id.ts), else to the thread
 * with the fewest calls in flight; `GET /metrics` to every thread, merged with a
 * `device_thread` label (metrics_merge.ts); anything else to thread 0. Each thread's memory
 * budget is its share of `--memory-budget-bytes`. A thread that stops (a crash, or one that ends
 * or blocks without an error: silent to the front's liveness ping for `ATTN_THREAD_LOST_MS`,
 * thread_watchdog.ts) fails its calls in flight and answers later ones with a 503
 * `device_thread_lost` (not logged: the stop is, once), and no new cache is placed on it.
 *
 * This module starts the threads; the front's handler, which routes as above, and its close
 * are in device_threads_front.ts.
 * @module
 */
import type { AccessPolicy } from "./auth.ts";
import { bodyLimits } from "./body.ts";
import { bodyReader } from "./head_refusal.ts";
import type { DeviceReadyMessage, DeviceThreadInit } from "./device_thread.ts";
import type { FrontMetrics } from "./front_metrics.ts";
import { type ErrorLogger, lineLogger } from "./problem.ts";
import type { ThreadListeners } from "./thread_listeners.ts";
import { Thread, type ThreadFault } from "./thread_handle.ts";
import { ThreadWatchdog, watchdogFromEnv, type WatchdogOptions } from "./thread_watchdog.ts";
import { stderrLock, useStderrLock } from "../gpu/runtime_stderr.ts";
import { front, threadExitGrace } from "./device_threads_front.ts";

export type { ThreadFault } from "./thread_handle.ts";

/** Options of {@link startDeviceThreads}. */
export interface DeviceThreadsOptions {
  threads: number;
  /** What every thread serves with (the budget is split; keep-warm goes to thread 0 only). */
  init: Omit<DeviceThreadInit, "type" | "index" | "stderrLock" | "working">;
  access: AccessPolicy;
  log?: ErrorLogger;
  /** How the threads' liveness is watched (default: thread_watchdog.ts watchdogFromEnv). */
  watchdog?: WatchdogOptions;
}

/** The running threads: the handler to serve, and how to close them after a drain. */
export interface DeviceThreads {
  readonly threads: number;
  handler(req: Request): Promise<Response>;
  /** The front's own counts, merged under `device_thread="front"` (for serveHttp's `metrics`). */
  readonly metrics: FrontMetrics;
  /** Closes every thread's service and device, then ends the threads. */
  close(): Promise<void>;
  /**
   * Makes thread `i` fail as `how` says (tests use it to exercise a lost thread): `throw` (an
   * error event), `exit` (it ends without one) or `hang` (its JS thread blocks `hangMs`).
   */
  fault(i: number, how?: ThreadFault): void;
  /**
   * `--device-threads-http`: every thread serves `port` too (thread_listeners.ts), passing
   * what is not its own to `handler` (the front's, as served; not drained on main's thread:
   * the thread that took a call drains it, main.ts `tracked`).
   */
  listen(
    o: { port: number; hostname: string; handler: (req: Request) => Promise<Response> },
  ): Promise<ThreadListeners>;
}

/**
 * Starts the threads and waits until each has its device. Resolves the front, or why a thread
 * could not start (`fatal`: an explicit runtime that cannot start; the threads are ended).
 */
export async function startDeviceThreads(
  o: DeviceThreadsOptions,
): Promise<{ ok: true; front: DeviceThreads } | { ok: false; reason: string; fatal: boolean }> {
  const log = o.log ?? lineLogger();
  // A body its route refuses by its head is not read (head_refusal.ts): not even to find its cache.
  const allowed = bodyReader(o.access, bodyLimits(o.init.maxBodyBytes, o.init.maxJsonBodyBytes));
  const n = o.threads;
  // Dawn's adapter requests redirect the process's fd 2 (gpu/runtime_stderr.ts): one at a time,
  // and this thread's own lines wait for them too.
  const lock = stderrLock();
  useStderrLock(lock);
  const scrapeToken = crypto.randomUUID();
  const threads = Array.from({ length: n }, (_, index) => {
    const init: DeviceThreadInit = {
      ...o.init,
      type: "device-init",
      index,
      stderrLock: lock,
      working: new Int32Array(new SharedArrayBuffer(8)),
      scrapeToken,
      memoryBudgetBytes: Math.floor(o.init.memoryBudgetBytes / n),
      ...(index === 0 ? {} : { keepWarm: undefined }),
    };
    return new Thread(index, init, o.init.maxBodyBytes, allowed, log);
  });
  const ready = await Promise.all(threads.map((t) => t.ready.promise));
  const bad = ready.findIndex((r) => !r.ok);
  if (bad >= 0) {
    const r = ready[bad] as Extract<DeviceReadyMessage, { ok: false }>;
    threads.forEach((t) => t.worker.terminate());
    await threadExitGrace(); // the process exits next (see threadExitGrace)
    return { ok: false, reason: `device thread ${bad}: ${r.reason}`, fatal: r.fatal };
  }
  const watchdog = new ThreadWatchdog(threads, o.watchdog ?? watchdogFromEnv());
  threads.forEach((t) => t.watchdog = watchdog);
  const instance = o.init.instance;
  return { ok: true, front: front(threads, scrapeToken, log, watchdog.start(), instance) };
}
