/**
 * The worker side of keep-warm's `worker` mode (gpu/keep_warm_thread.ts starts it): a Dawn
 * device of its own, in its own thread, spinning while the serving thread's last use of its
 * device is less than `hold_ms` old. The GPU's clock is the card's, not the device's, so spins
 * here hold it up for the serving device too, and every wait is this thread's: the serving
 * thread only stamps its uses into shared memory.
 *
 * Protocol: one `init` message ({@link WarmWorkerInit}); the answer is `{ ready, spin_ms,
 * adapter }` once the spin kernel has run once, or `{ error }` (no adapter, no device, a compile
 * error), after which the worker ends. Shared `Int32Array` words ({@link WARM_WORDS}): the last
 * use (ms since the shared origin), the close flag, the dispatch count, and the sleeping flag
 * the serving thread reads to decide whether to wake this one. On close it destroys its device
 * and posts `{ closed }`.
 * @module
 */
import { importDawn } from "./runtime_dawn.ts";

/** Word indices of the shared `Int32Array`. */
export const WARM_WORDS = { stamp: 0, closed: 1, dispatches: 2, sleeping: 3, length: 4 } as const;

/** The `init` message. */
export interface WarmWorkerInit {
  /** Dawn's flags (the server's). */
  flags: string[];
  /** The spin kernel's whole WGSL (bindings included; binding 0: its sink). */
  wgsl: string;
  /** Workgroups of 64 lanes per spin. */
  workgroups: number;
  /** Spins per submit; the next submit waits for the last. */
  depth: number;
  /** A submit starts at most every `period_ms` (the rest of the period sleeps). */
  period_ms: number;
  /** Keep spinning this long after the last stamped use, in ms. */
  hold_ms: number;
  /** `performance.timeOrigin + performance.now()` that stamps count from, in ms. */
  origin: number;
  /** The shared words. */
  shared: SharedArrayBuffer;
}

/** The `init` answer: ready, or why not. */
export type WarmWorkerReply =
  | { ready: true; spin_ms: number; adapter: string }
  | { error: string }
  | { closed: true };

/** What this module uses of the worker's global scope. */
interface WorkerScope {
  postMessage(message: WarmWorkerReply): void;
  onmessage: ((e: MessageEvent<WarmWorkerInit>) => void) | null;
}
const scope = self as unknown as WorkerScope;

const IDLE_WAIT_MS = 50; // an idle worker re-reads the stamp at least this often

const since = (origin: number) => performance.timeOrigin + performance.now() - origin;

/** A device, its spin pipeline and bind group, or why there is none. */
async function spinDevice(init: WarmWorkerInit) {
  const { create } = await importDawn();
  const adapter = await create(init.flags).requestAdapter();
  if (!adapter) return "Dawn found no adapter";
  const device = await adapter.requestDevice();
  device.pushErrorScope("validation");
  const pipeline = device.createComputePipeline({
    layout: "auto",
    compute: { module: device.createShaderModule({ code: init.wgsl }), entryPoint: "main" },
  });
  const sink = device.createBuffer({ size: init.workgroups * 256, usage: GPUBufferUsage.STORAGE });
  const group = device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: sink } }],
  });
  const error = await device.popErrorScope();
  if (error) return `the spin kernel did not compile: ${error.message}`;
  return { device, pipeline, group, adapter: adapter.info?.description ?? "" };
}

async function run(init: WarmWorkerInit): Promise<void> {
  const words = new Int32Array(init.shared);
  const got = await spinDevice(init);
  if (typeof got === "string") return scope.postMessage({ error: got });
  const { device, pipeline, group } = got;
  const spin = async (n: number) => {
    const enc = device.createCommandEncoder({ label: "keep-warm" });
    for (let i = 0; i < n; i++) {
      const pass = enc.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(init.workgroups);
      pass.end();
    }
    device.queue.submit([enc.finish()]);
    Atomics.add(words, WARM_WORDS.dispatches, n);
    await device.queue.onSubmittedWorkDone();
  };
  const t0 = performance.now();
  await spin(1);
  scope.postMessage({ ready: true, spin_ms: performance.now() - t0, adapter: got.adapter });
  while (Atomics.load(words, WARM_WORDS.closed) === 0) {
    const stamp = Atomics.load(words, WARM_WORDS.stamp);
    if (since(init.origin) - stamp < init.hold_ms) {
      const t = performance.now();
      await spin(init.depth);
      const rest = init.period_ms - (performance.now() - t);
      if (rest >= 1) await new Promise((r) => setTimeout(r, rest));
      continue;
    }
    Atomics.store(words, WARM_WORDS.sleeping, 1);
    if (Atomics.load(words, WARM_WORDS.stamp) === stamp) { // no use since the read: sleep
      await Atomics.waitAsync(words, WARM_WORDS.stamp, stamp, IDLE_WAIT_MS).value;
    }
    Atomics.store(words, WARM_WORDS.sleeping, 0);
  }
  device.destroy();
  scope.postMessage({ closed: true });
}

scope.onmessage = (e: MessageEvent<WarmWorkerInit>) => {
  run(e.data).catch((err) => {
    scope.postMessage({ error: err instanceof Error ? err.message.split("\n")[0] : String(err) });
  });
};
