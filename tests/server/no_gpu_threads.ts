/**
 * Device threads in process without a GPU (`gpu: false`: each thread answers on CPU_REFERENCE),
 * for the tests of the threads' routing, listeners and fuzzing.
 * @module
 */
import assert from "node:assert/strict";
import { type DeviceThreads, startDeviceThreads } from "../../server/device_threads.ts";
import type { ErrorLogger } from "../../server/problem.ts";
import { DEFAULT_CALL_LIMITS } from "../../service/validate.ts";

/** What a test may set; the rest: 64 MiB of cache budget, 16 MiB bodies, no log. */
export interface NoGpuThreadsOptions {
  memoryBudgetBytes?: number;
  maxBodyBytes?: number;
  maxJsonBodyBytes?: number;
  log?: ErrorLogger;
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
  });
  assert.ok(started.ok, started.ok ? "" : started.reason);
  return started.front;
}
