/**
 * Device threads in process without a GPU (`gpu: false`: each thread answers on CPU_REFERENCE),
 * for the tests of the threads' routing, listeners and fuzzing.
 * @module
 */
import assert from "node:assert/strict";
import { type DeviceThreads, startDeviceThreads } from "../../server/device_threads.ts";
import type { ErrorLogger } from "../../server/problem.ts";
import type { WatchdogOptions } from "../../server/thread_watchdog.ts";
import { DEFAULT_CALL_LIMITS } from "../../service/validate.ts";

/** What a test may set; the rest: 64 MiB of cache budget, 16 MiB bodies, no log. */
export interface NoGpuThreadsOptions {
  memoryBudgetBytes?: number;
  maxBodyBytes?: number;
  maxJsonBodyBytes?: number;
  log?: ErrorLogger;
  /** The liveness watchdog (default: the environment's, thread_watchdog.ts). */
  watchdog?: WatchdogOptions;
}

/** Starts `threads` device threads without a GPU and returns their front (asserting they started). */
export async function startNoGpuThreads(
  threads: number,
  o: NoGpuThreadsOptions = {},
): Promise<DeviceThreads> {
  const started = await startDeviceThreads({
    threads,
    init: {
      gpu: false,
      runtime: { choice: "deno", dawnFlags: [] },
      memoryBudgetBytes: o.memoryBudgetBytes ?? 2 ** 26,
      limits: { ...DEFAULT_CALL_LIMITS },
      maxBodyBytes: o.maxBodyBytes ?? 2 ** 24,
      maxJsonBodyBytes: o.maxJsonBodyBytes ?? 2 ** 24,
      access: {},
    },
    access: {},
    log: o.log ?? (() => {}),
    ...(o.watchdog ? { watchdog: o.watchdog } : {}),
  });
  assert.ok(started.ok, started.ok ? "" : started.reason);
  return started.front;
}

/** Calls `front`'s handler in process: `method` on `path`, with `body` as JSON if given. */
export function frontCaller(front: DeviceThreads) {
  return (method: string, path: string, body?: unknown): Promise<Response> =>
    front.handler(
      new Request(`http://127.0.0.1${path}`, {
        method,
        headers: body ? { "content-type": "application/json" } : {},
        body: body ? JSON.stringify(body) : undefined,
      }),
    );
}

/**
 * Waits until `lines` holds a line matching `re`, or `ms` passed (the caller then asserts): the
 * watchdog's verdict comes when its ticks do, and a late tick judges no thread.
 */
export async function logged(lines: string[], re: RegExp, ms: number): Promise<void> {
  const end = performance.now() + ms;
  while (!lines.some((l) => re.test(l)) && performance.now() < end) {
    await new Promise((r) => setTimeout(r, 20));
  }
}
