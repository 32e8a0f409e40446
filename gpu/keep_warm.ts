/**
 * Keep-warm: holds the GPU's clock up between calls. Measured on the H200 (bench/NOTES.md v0.5,
 * v0.6): a served decode call's kernels ran at 345-420 MHz of 1,980, because the driver lowers the
 * SM clock within seconds of idling and a light, bursty load (one 0.1 ms call every few ms) does
 * not raise it again; the same call's GPU time was 0.11 ms at full clock and 0.44-0.50 ms served.
 *
 * {@link KeepWarmProvider} wraps the server's {@link DeviceProvider}: each use of the device (a
 * forward call, a cache write) re-arms a window of `hold_ms`, and while it is open a loop keeps
 * `depth` short spin dispatches queued (`workgroups` workgroups of 64 lanes, `spin_iters`
 * dependent FMA pairs each: about 8 cycles an iteration). A real call's work queues behind at most
 * `depth` spins, and shares the GPU with one while it runs (the spin touches only its own buffer,
 * so no barrier orders them). Spinning draws power: it is off by default (`hold_ms` 0), the
 * operator's alternative being locked clocks (`nvidia-smi --lock-gpu-clocks`, root).
 *
 * It needs a runtime whose completion wait does not block the JS thread: Deno's own WebGPU blocks
 * ~11 ms per `onSubmittedWorkDone`. {@link KeepWarmProvider.start} measures the completion round
 * trip and stays off, saying why, where it is over {@link MAX_ROUND_TRIP_MS}.
 * @module
 */
import type { DeviceProvider, DeviceReport, GpuContext, KeepWarmReport } from "../core/types.ts";
import { getKernel, type KernelDef } from "./kernel.ts";
import { completionRoundTrip } from "./runtime_device.ts";

/** Keep-warm knobs (`deno task serve --keep-warm-ms N ...`). */
export interface KeepWarmOptions {
  /** Keep the GPU busy this long after the last use of the device, in ms; 0: off. */
  hold_ms: number;
  /** Dependent FMA pairs per lane of one spin dispatch (its length). */
  spin_iters: number;
  /** Workgroups (64 lanes) per spin dispatch. */
  workgroups: number;
  /** Spin dispatches kept queued (1: submit the next when the last completed). */
  depth: number;
}

/** The defaults: off; when on, ~40 µs spins on one workgroup at the H200's full clock. */
export const KEEP_WARM_DEFAULTS: Readonly<KeepWarmOptions> = Object.freeze({
  hold_ms: 0,
  spin_iters: 10_000,
  workgroups: 1,
  depth: 1,
});

/** Completion round trips (median ms) above this leave keep-warm off. */
export const MAX_ROUND_TRIP_MS = 1;

/** What keep-warm did (`/v1/device`'s `keep_warm`, the bench). */
export type KeepWarmStats = KeepWarmReport;

/** The spin kernel, as data. */
export const KEEP_WARM: KernelDef<{ iters: number }> = {
  name: "keep_warm",
  uniforms: [],
  bindings: () => [{ name: "sink", kind: "read_write", type: "array<f32>" }],
  source: (c) =>
    `@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = 1.0 + f32(g.x) * 1e-3;
  var y = 0.5;
  for (var i = 0u; i < ${c.iters}u; i++) {
    x = fma(x, 0.99993, y * 1e-4);
    y = fma(y, 1.00007, -x * 1e-4);
  }
  sink[g.x] = x + y;
}
`,
};

/** @throws Error naming a knob that is out of range and its value. */
export function checkKeepWarmOptions(o: KeepWarmOptions): KeepWarmOptions {
  const bad = (k: keyof KeepWarmOptions, min: number, max: number) => {
    const v = o[k];
    if (!Number.isSafeInteger(v) || v < min || v > max) {
      throw new Error(`keep-warm ${k} must be an integer in [${min}, ${max}], got ${v}`);
    }
  };
  bad("hold_ms", 0, 3_600_000);
  bad("spin_iters", 1, 10_000_000);
  bad("workgroups", 1, 65_535);
  bad("depth", 1, 8);
  return o;
}

/** A {@link DeviceProvider} that keeps the GPU busy for `hold_ms` after each use (module doc). */
export class KeepWarmProvider implements DeviceProvider {
  readonly #inner: DeviceProvider;
  readonly #o: KeepWarmOptions;
  #enabled = false;
  #reason?: string;
  #roundTrip?: number;
  #last = -Infinity;
  #loop: Promise<void> | null = null;
  #closed = false;
  #dispatches = 0;
  #sink = new WeakMap<GPUDevice, { buffer: GPUBuffer; group: GPUBindGroup }>();

  readonly #maxRoundTrip: number;

  /** `max_round_trip_ms`: the slowest completion round trip it runs with (tests raise it). */
  constructor(
    inner: DeviceProvider,
    options: KeepWarmOptions,
    { max_round_trip_ms = MAX_ROUND_TRIP_MS }: { max_round_trip_ms?: number } = {},
  ) {
    this.#inner = inner;
    this.#o = checkKeepWarmOptions({ ...options });
    this.#maxRoundTrip = max_round_trip_ms;
  }

  /** Measures the completion round trip; turns on where it is short. Resolves to the stats. */
  async start(): Promise<KeepWarmStats> {
    const ctx = this.#inner.current();
    if (this.#o.hold_ms === 0) this.#reason = "hold_ms is 0";
    else if (!ctx) this.#reason = "no device";
    else {
      const { ms } = await completionRoundTrip(ctx.device, 5);
      const sorted = [...ms].sort((a, b) => a - b);
      this.#roundTrip = sorted[sorted.length >> 1];
      if (this.#roundTrip > this.#maxRoundTrip) {
        this.#reason = `the runtime's completion round trip is ${this.#roundTrip.toFixed(2)} ms ` +
          `(over ${this.#maxRoundTrip} ms: its waits would block the JS thread)`;
      } else this.#enabled = true;
    }
    return this.stats();
  }

  current(): GpuContext | null {
    const g = this.#inner.current();
    if (g) this.#touch(g);
    return g;
  }

  async acquire(): Promise<GpuContext | null> {
    const g = await this.#inner.acquire();
    if (g) this.#touch(g);
    return g;
  }

  report(): DeviceReport {
    return { ...this.#inner.report(), keep_warm: this.stats() };
  }

  stats(): KeepWarmStats {
    return {
      enabled: this.#enabled,
      ...(this.#reason ? { reason: this.#reason } : {}),
      options: { ...this.#o },
      ...(this.#roundTrip !== undefined ? { round_trip_ms: this.#roundTrip } : {}),
      dispatches: this.#dispatches,
      spinning: this.#loop !== null,
    };
  }

  /** Stops spinning; resolves once the last spin completed. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#loop;
  }

  #touch(g: GpuContext): void {
    if (!this.#enabled || this.#closed) return;
    this.#last = performance.now();
    if (this.#loop) return;
    this.#loop = this.#spin(g).catch(() => {}).finally(() => this.#loop = null);
  }

  #bound(g: GpuContext, layout: GPUBindGroupLayout): GPUBindGroup {
    let s = this.#sink.get(g.device);
    if (!s) {
      const size = this.#o.workgroups * 64 * 4;
      const buffer = g.device.createBuffer({
        size,
        usage: GPUBufferUsage.STORAGE,
        label: "keep-warm",
      });
      const group = g.device.createBindGroup({
        layout,
        entries: [{ binding: 0, resource: { buffer } }],
      });
      this.#sink.set(g.device, s = { buffer, group });
    }
    return s.group;
  }

  async #spin(g: GpuContext): Promise<void> {
    const k = await getKernel(g, KEEP_WARM, { iters: this.#o.spin_iters });
    const group = this.#bound(g, k.layout);
    const queued: Promise<unknown>[] = [];
    const open = () => !this.#closed && !g.lost && performance.now() - this.#last < this.#o.hold_ms;
    while (open()) {
      const enc = g.device.createCommandEncoder({ label: "keep-warm" });
      const pass = enc.beginComputePass();
      pass.setPipeline(k.pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(this.#o.workgroups);
      pass.end();
      g.device.queue.submit([enc.finish()]);
      this.#dispatches++;
      queued.push(g.device.queue.onSubmittedWorkDone());
      if (queued.length >= this.#o.depth) await queued.shift();
    }
    await Promise.all(queued);
  }
}
