/**
 * Device time of a plan's kernels, without the readback: the plan is bound to the batch
 * (gpu/gpu_plan.ts bindGpuPlan) and launched once as a call would run (cache write, poison,
 * attention), then its attention calls are appended `reps` more times to the same submit,
 * back to back after untimed warm-up launches that run until the pass time stops falling (an
 * idle GPU runs at low clocks: an H200 idles at 345 MHz of 1980), each pass timed by
 * timestamp-query (gpu/launch.ts). Reported is the median over the repetitions of each
 * attention call's pass time and their sum per repetition. The breakdown beside it
 * ({@link DeviceBreakdown}): the same repetitions in ONE timed pass (no timestamps between the
 * dispatches: what a CUDA-event loop around SDPA measures), the first call alone that way, the
 * time of the plan's `poison` passes (a fill of the output: about the fixed cost of one timed
 * pass) and, for decode variants built with `probe_residency`, the most split workgroups that
 * were resident at once (gpu/decode_residency.ts).
 * @module
 */
import type { GpuContext, ValidBatch } from "../core/types.ts";
import { bindGpuPlan, type GpuPlan } from "../gpu/gpu_plan.ts";
import { type KernelCall, launch, type LaunchSpec } from "../gpu/launch.ts";
import { RESIDENCY_INFO, residencyReads, residencyUploads } from "../gpu/decode_residency.ts";

/** Passes that are not attention (cache write, output poisoning, the device finiteness check). */
const NOT_ATTENTION = new Set(["cache_write", "poison", "finite_check"]);

/** What {@link deviceTime} measured. */
export interface DeviceTime {
  /** Milliseconds per repetition of all attention passes (median of the repetitions). */
  ms: number;
  /** Milliseconds per attention pass name (median). */
  per_kernel: Record<string, number>;
  reps: number;
  breakdown: DeviceBreakdown;
}

/** Where a repetition's time goes besides the per-pass sum (milliseconds, per repetition). */
export interface DeviceBreakdown {
  /** Every attention call of a repetition, all repetitions back to back in one timed pass. */
  one_pass: number;
  /** The first attention call alone (decode: the split kernel), repetitions in one pass; NaN
   * when it is the only one (then `one_pass`). */
  first_one_pass: number;
  /** Mean time of one `poison` pass (a fill of the output): a timed pass's floor. */
  poison_pass?: number;
  /** Most split workgroups resident at once, and how many ran (`probe_residency` plans). */
  resident_peak?: number;
  resident_total?: number;
}

/**
 * Times the attention passes of plan `p` on batch `b` (see the module doc); null when the
 * device has no timestamp-query.
 */
export async function deviceTime(
  p: GpuPlan,
  b: ValidBatch,
  gpu: GpuContext,
  reps: number,
): Promise<DeviceTime | null> {
  if (!gpu.features.has("timestamp-query")) return null;
  const bound = bindGpuPlan(p, b, gpu);
  try {
    const att = bound.calls.filter((c) => !NOT_ATTENTION.has(c.name));
    const names = [...new Set(att.map((c) => c.name))];
    const calls = [...bound.calls];
    const warm = await warmUpReps(gpu, bound, calls, att, reps);
    for (let r = 0; r < warm; r++) calls.push(...att.map((c) => ({ ...c, name: "warm-up" })));
    for (let r = 0; r < reps; r++) {
      for (const c of att) calls.push({ ...c, name: `rep${r}:${c.name}` });
    }
    const res = await launch(gpu, {
      label: "bench",
      uploads: bound.uploads,
      clears: bound.clears,
      calls,
      reads: [],
    });
    const per_kernel: Record<string, number> = {};
    const totals: number[] = [];
    for (let r = 0; r < reps; r++) {
      totals.push(names.reduce((s, n) => s + (res.gpu[`rep${r}:${n}`] ?? 0), 0));
    }
    for (const n of names) {
      per_kernel[n] = median(Array.from({ length: reps }, (_, r) => res.gpu[`rep${r}:${n}`] ?? 0));
    }
    const poisons = bound.calls.filter((c) => c.name === "poison").length;
    const breakdown: DeviceBreakdown = {
      one_pass: await onePass(gpu, bound.uploads, att, reps),
      first_one_pass: att.length > 1
        ? await onePass(gpu, bound.uploads, att.slice(0, 1), reps)
        : NaN,
      ...(poisons > 0 && res.gpu.poison ? { poison_pass: res.gpu.poison / poisons } : {}),
      ...(p.info?.[RESIDENCY_INFO] ? await residency(gpu, att) : {}),
    };
    return { ms: median(totals), per_kernel, reps, breakdown };
  } finally {
    bound.release();
  }
}

/** Milliseconds per repetition of `att`, `reps` repetitions in one timed pass (best of 2). */
async function onePass(
  gpu: GpuContext,
  uploads: LaunchSpec["uploads"],
  att: KernelCall[],
  reps: number,
): Promise<number> {
  const calls = Array.from({ length: reps }, () => att).flat();
  let best = Infinity;
  for (let k = 0; k < 2; k++) {
    const spec = { label: "bench.one-pass", uploads, calls, reads: [], timing: "total" as const };
    const res = await launch(gpu, spec);
    best = Math.min(best, (res.gpu.gpu ?? NaN) / reps);
  }
  return best;
}

/** The residency probe's counters after one dispatch of the plan's attention calls. */
async function residency(
  gpu: GpuContext,
  att: KernelCall[],
): Promise<Pick<DeviceBreakdown, "resident_peak" | "resident_total">> {
  const res = await launch(gpu, {
    label: "bench.residency",
    uploads: residencyUploads(gpu),
    calls: att,
    reads: residencyReads(gpu),
    timing: "none",
  });
  const w = new Uint32Array(res.parts[0].slice().buffer);
  res.release();
  return { resident_peak: w[1], resident_total: w[2] };
}

/** Device time of each warm-up launch, and the most warm-up launches. */
const WARM_UP_MS = 100;
const MAX_WARM_UPS = 10;
/** The most passes one launch holds (two timestamps each; query sets hold 4096). */
const MAX_PASSES = 2000;

/**
 * Warms the GPU up on the plan's own passes: launches of about {@link WARM_UP_MS} of device
 * time each until the per-repetition time stops falling (within 3% of the previous launch,
 * after at least three), since an idle GPU runs at low clocks and ramps up under load (an
 * H200 idles at 345 MHz of 1980; after a pipeline compiled for 2 s, 150 ms of warm-up was
 * not enough: the same kernel read 2x slower). Returns the repetitions for one more
 * warm-up pass inside the timed launch (none: the launches did it).
 */
async function warmUpReps(
  gpu: GpuContext,
  io: Pick<LaunchSpec, "uploads" | "clears">,
  first: KernelCall[],
  att: KernelCall[],
  reps: number,
): Promise<number> {
  const room = Math.floor((MAX_PASSES - first.length) / Math.max(1, att.length)) - reps;
  let per = Infinity, n = 3;
  for (let k = 0; k < MAX_WARM_UPS; k++) {
    const calls = [...first];
    for (let r = 0; r < n; r++) calls.push(...att.map((c) => ({ ...c, name: `warm${r}` })));
    const res = await launch(gpu, {
      label: "bench.warm-up",
      uploads: io.uploads,
      clears: io.clears,
      calls,
      reads: [],
    });
    const now = median(Array.from({ length: n }, (_, r) => res.gpu[`warm${r}`] ?? 0));
    const stable = k >= 2 && now >= per * 0.97;
    per = Math.min(per, now);
    if (stable) break;
    n = Math.max(3, Math.min(room, Math.ceil(WARM_UP_MS / Math.max(now, 1e-3))));
  }
  return Math.max(0, Math.min(room, Math.ceil(20 / Math.max(per, 1e-3))));
}

function median(a: number[]): number {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor(s.length / 2)];
}
