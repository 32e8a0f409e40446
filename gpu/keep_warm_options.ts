/**
 * Keep-warm's knobs, their defaults and range check, the spin kernel as data, and binding,
 * submitting and timing it: what the server's flags, the in-thread provider (gpu/keep_warm.ts)
 * and the spinner process (gpu/keep_warm_child.ts) share.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { getKernel, type KernelDef } from "./kernel.ts";

/** Keep-warm knobs (`deno task serve --keep-warm-ms N ...`). */
export interface KeepWarmOptions {
  /** Keep the GPU busy this long after the last use of the device, in ms; 0: off. */
  hold_ms: number;
  /** Dependent FMA pairs per lane of one spin dispatch (its length). */
  spin_iters: number;
  /** Workgroups (64 lanes) per spin dispatch. */
  workgroups: number;
  /** Spin dispatches per tick (`timer`, `process`), or kept queued (`await`; 1: the next when one
   * is done). */
  depth: number;
  /** `timer`: spins from a timer, nothing awaited; `await`: a loop awaiting each spin. */
  mode: KeepWarmMode;
  /** `timer`, `process`: ms between ticks. */
  period_ms: number;
}

/** How spins are paced (module doc). */
export type KeepWarmMode = "timer" | "await" | "process";

/** The modes, for the flag's check. */
export const KEEP_WARM_MODES: readonly KeepWarmMode[] = ["timer", "await", "process"];

/** The defaults: off; when on, eight ~40 µs spins on one workgroup every 1 ms (about a third of
 * the time busy at the H200's full clock): what held it at a median 1,455 MHz in v0.6's HTTP run
 * (bench/NOTES.md, call 4). */
export const KEEP_WARM_DEFAULTS: Readonly<KeepWarmOptions> = Object.freeze({
  hold_ms: 0,
  spin_iters: 10_000,
  workgroups: 1,
  depth: 8,
  mode: "timer",
  period_ms: 1,
});

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
  const bad = (k: Exclude<keyof KeepWarmOptions, "mode">, min: number, max: number) => {
    const v = o[k];
    if (!Number.isSafeInteger(v) || v < min || v > max) {
      throw new Error(`keep-warm ${k} must be an integer in [${min}, ${max}], got ${v}`);
    }
  };
  bad("hold_ms", 0, 3_600_000);
  bad("spin_iters", 1, 10_000_000);
  bad("workgroups", 1, 65_535);
  bad("depth", 1, 8);
  bad("period_ms", 1, 1000);
  if (!KEEP_WARM_MODES.includes(o.mode)) {
    throw new Error(`keep-warm mode must be one of ${KEEP_WARM_MODES.join(", ")}, got ${o.mode}`);
  }
  return o;
}

/** A compiled spin kernel with its sink buffer bound. */
export interface SpinKernel {
  pipeline: GPUComputePipeline;
  group: GPUBindGroup;
  workgroups: number;
}

/**
 * The spin kernel of `iters` iterations compiled on `ctx` (the shared kernel cache) and bound to
 * a sink for `workgroups` workgroups.
 * @throws ShaderCompileError with the compiler's messages.
 */
export async function bindSpinKernel(
  ctx: GpuContext,
  iters: number,
  workgroups: number,
): Promise<SpinKernel> {
  const k = await getKernel(ctx, KEEP_WARM, { iters });
  const buffer = ctx.device.createBuffer({
    size: workgroups * 64 * 4,
    usage: GPUBufferUsage.STORAGE,
    label: "keep-warm",
  });
  const group = ctx.device.createBindGroup({
    layout: k.layout,
    entries: [{ binding: 0, resource: { buffer } }],
  });
  return { pipeline: k.pipeline, group, workgroups };
}

/**
 * Submits `n` spin dispatches in one compute pass of one command buffer. They run one after
 * another all the same (each writes the sink the next writes: the device orders them), and the
 * serving thread records one pass instead of `n` (the timer mode records one every period_ms,
 * 1 ms by default: `n` passes cost ~100-140 us a tick on Dawn over lavapipe, ~40 in one).
 */
export function submitSpins(device: GPUDevice, k: SpinKernel, n: number): void {
  const enc = device.createCommandEncoder({ label: "keep-warm" });
  const pass = enc.beginComputePass();
  pass.setPipeline(k.pipeline);
  pass.setBindGroup(0, k.group);
  for (let i = 0; i < n; i++) pass.dispatchWorkgroups(k.workgroups);
  pass.end();
  device.queue.submit([enc.finish()]);
}

/** One spin's device time (ms): 8 in one submit after a first, less `roundTripMs`, over 8. */
export async function measureSpin(
  device: GPUDevice,
  k: SpinKernel,
  roundTripMs: number,
): Promise<number> {
  submitSpins(device, k, 1); // first use off the clock
  await device.queue.onSubmittedWorkDone();
  const reps = 8, t = performance.now();
  submitSpins(device, k, reps);
  await device.queue.onSubmittedWorkDone();
  return Math.max(0, performance.now() - t - roundTripMs) / reps;
}
