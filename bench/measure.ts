/**
 * One backend on one bench shape ({@link measureBackend}): a cold plan (pipeline compilation
 * included), a first run whose output is compared with the shape's reference output, the
 * device time of the attention kernels (bench/device_time.ts: repetitions in one submit, no
 * readback), and awaited end-to-end calls. Derived: TFLOP/s (prefill) or KV GB/s (decode)
 * from the device time, and their ratios to the same-run FMA and copy yardsticks; a mixed
 * shape's device time split into its decode and prefill parts by pass name where its passes
 * keep them apart ({@link partsOf}), the decode part's KV GB/s and the prefill part's TFLOP/s
 * from those.
 * @module
 */
import { toFloat32 } from "../core/data.ts";
import type { AttentionBackend, GpuContext, ValidBatch } from "../core/types.ts";
import type { PlanPaths } from "../core/backend_types.ts";
import type { GpuPlan } from "../gpu/gpu_plan.ts";
import { type DeviceBreakdown, deviceTime } from "./device_time.ts";
import { type BenchShape, mixedParts, work } from "./shapes.ts";

/** One backend (or variant) on one shape. */
export interface BackendRow {
  case: string;
  backend: string;
  skipped?: string;
  /** First plan (pipeline compilation included) and first run, ms. */
  plan_cold_ms?: number;
  first_run_ms?: number;
  /** Device ms of the attention kernels per call (median of repetitions), per kernel. */
  device_ms?: number;
  device_kernels?: Record<string, number>;
  /** One-pass times, a timed pass's floor, residency (bench/device_time.ts). */
  device_breakdown?: DeviceBreakdown;
  /** Median of awaited run() calls: the end-to-end per-call time. */
  e2e_ms?: number;
  tflops?: number;
  /** TFLOP/s / the same-run FMA ceiling. */
  x_fma?: number;
  kv_gbps?: number;
  /** KV GB/s / the same-run copy GB/s (read + write). */
  x_copy?: number;
  /**
   * A mixed shape's device ms per part ({@link partsOf}); null where the same passes ran both
   * parts (e.g. the chunks on the split-KV kernels too, each token a decode row). On a mixed
   * row `kv_gbps` / `x_copy` are the decode part's and `tflops` / `x_fma` the prefill part's,
   * each from its own passes' time (absent when null).
   */
  device_parts?: MixedParts | null;
  /** PyTorch SDPA's ms for this shape (bench/anchor.ts); null where the anchor has none. */
  sdpa_ms?: number | null;
  /** SDPA's ms / `device_ms`: above 1 ours is faster; null where either is missing. */
  x_sdpa?: number | null;
  /**
   * SDPA's ms / the stream time (`device_breakdown.one_pass`: every repetition back to back in
   * one timed pass, as bench/torch_anchor.py times SDPA over 50 calls between two events), so
   * no per-pass start and drain is counted; null where either is missing.
   */
  x_sdpa_stream?: number | null;
  /** Largest |difference| of the output from the shape's reference output. */
  max_diff?: number;
  /** The plan's kernels and counts. */
  kernels?: string[];
  info?: Record<string, number>;
  /**
   * Which kernels ran the decode and prefill rows, and why not the preferred ones, where the
   * plan records them (WEBGPU_FLASH): `X-Attention-Paths`, then `X-Attention-Path-Reasons`.
   */
  paths?: string;
}

/** What the measurement needs besides the backend. */
export interface MeasureContext {
  gpu: GpuContext;
  /** The shape's batch, validated with the cache for this backend's storage. */
  batch: ValidBatch;
  iters: number;
  reps: number;
  fmaTflops: number;
  copyGbps: number;
  /** The output to compare with (null: this row becomes the reference). */
  reference: Float32Array | null;
}

/** A mixed call's device ms: its decode rows' passes and its prefill rows' passes. */
export interface MixedParts {
  decode_ms: number;
  prefill_ms: number;
}

/**
 * The device ms of a mixed call's parts from its per-pass times ({@link DeviceTime}'s
 * `per_kernel`): `decode_*` passes (`decode_split`, `decode_reduce`) ran the decode rows and
 * `prefill*` passes (`prefill`, `prefill_mma`, and `prefill_split`, `prefill_reduce`: the split-KV
 * kernels' own dispatch for them) the other rows. Null where a part has no pass of its own (both
 * parts in one split-KV dispatch) or a pass has another name.
 */
export function partsOf(perKernel: Record<string, number>): MixedParts | null {
  let decode_ms = 0, prefill_ms = 0, d = 0, p = 0;
  for (const [name, ms] of Object.entries(perKernel)) {
    if (name.startsWith("decode")) (decode_ms += ms), d++;
    else if (name.startsWith("prefill")) (prefill_ms += ms), p++;
    else return null;
  }
  return d && p ? { decode_ms, prefill_ms } : null;
}

/** A plan's paths as the bench prints them: the headers' values, the reasons after a "; ". */
export function pathsText(p: PlanPaths): string {
  return p.reasons_header ? `${p.header}; ${p.reasons_header}` : p.header;
}

const median = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];

/** Measures `b` on `s` (see the module doc); returns the row and its output. */
export async function measureBackend(
  label: string,
  caseName: string,
  b: AttentionBackend,
  s: BenchShape,
  m: MeasureContext,
): Promise<{ row: BackendRow; output: Float32Array }> {
  const ctx = { gpu: m.gpu };
  const batch = m.batch;
  let t = performance.now();
  const plan = await b.plan(batch, ctx);
  const plan_cold_ms = performance.now() - t;
  try {
    t = performance.now();
    const first = await b.run(plan, batch, ctx);
    const first_run_ms = performance.now() - t;
    const output = toFloat32(first.output).slice();
    let max_diff: number | undefined;
    if (m.reference) {
      max_diff = 0;
      for (let i = 0; i < output.length; i++) {
        const d = Math.abs(output[i] - m.reference[i]);
        max_diff = Number.isNaN(d) ? NaN : Math.max(max_diff, d);
        if (Number.isNaN(max_diff)) break;
      }
    }
    const device = b.requires.needs_device
      ? await deviceTime(plan as unknown as GpuPlan, batch, m.gpu, m.reps)
      : null;
    const e2e: number[] = [];
    for (let i = 0; i < m.iters; i++) {
      t = performance.now();
      await b.run(plan, batch, ctx);
      e2e.push(performance.now() - t);
    }
    const e2e_ms = e2e.length ? median(e2e) : first_run_ms;
    const ms = device?.ms ?? e2e_ms;
    const w = work(s);
    const p = plan as unknown as Partial<GpuPlan>;
    const row: BackendRow = {
      case: caseName,
      backend: label,
      plan_cold_ms,
      first_run_ms,
      device_ms: device?.ms,
      device_kernels: device?.per_kernel,
      device_breakdown: device?.breakdown,
      e2e_ms,
      max_diff,
      kernels: p.kernels,
      info: p.info,
      ...(plan.paths?.header ? { paths: pathsText(plan.paths) } : {}),
    };
    const mixed = mixedParts(s);
    if (mixed) {
      if (device) {
        const parts = partsOf(device.per_kernel);
        row.device_parts = parts;
        if (parts) {
          row.kv_gbps = work(mixed.decode).kv_bytes / parts.decode_ms / 1e6;
          row.x_copy = row.kv_gbps / m.copyGbps;
          row.tflops = work(mixed.prefill).flops / parts.prefill_ms / 1e9;
          row.x_fma = row.tflops / m.fmaTflops;
        }
      }
    } else if (s.kind === "prefill") {
      row.tflops = w.flops / ms / 1e9;
      row.x_fma = row.tflops / m.fmaTflops;
    } else {
      row.kv_gbps = w.kv_bytes / ms / 1e6;
      row.x_copy = row.kv_gbps / m.copyGbps;
    }
    return { row, output };
  } finally {
    b.disposePlan?.(plan);
  }
}
