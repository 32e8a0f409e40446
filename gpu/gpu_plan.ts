/**
 * The plan format every GPU backend produces, and the one `run` that executes it (plan on
 * metadata, run on tensors, after FlashInfer). A {@link GpuPlan} is built from a batch's shape
 * alone: compiled kernels, one table (every Params block and metadata table, as bytes), the
 * calls in order with their bindings named symbolically, and the sizes of the per-call
 * buffers. A plan owns no GPU memory. A plan for a large batch checks the data's finiteness
 * on the device first and writes the cache only when it holds (gpu/finite_check.ts); a bad
 * call then fails with the validator's 422 after the readback, its cache unchanged.
 * {@link runGpuPlan} binds the plan to pooled buffers (gpu/plan_bind.ts: a steady state reuses
 * its resolved calls and bind groups, and skips a table its buffer holds already), writes the
 * table and the query/key/value bytes as they came (one write for the three where a body carried
 * them back to back, else one each), zeroes the finiteness flags, poisons the outputs,
 * dispatches everything in one compute pass of one submission (see {@link gpuTiming}) and reads
 * output and LSE back with one `mapAsync`, into lent host memory: the result's arrays are views
 * of it until `ForwardResult.release()`.
 * The output comes back in the batch dtype; nothing is converted on the host.
 * @module
 */
import { DeviceUnavailableError, invalidBatch } from "../core/errors.ts";
import type {
  DType,
  ForwardResult,
  GpuContext,
  PlanContract,
  RunOptions,
  ValidBatch,
} from "../core/types.ts";
import { bytesPerElement } from "../core/dtype.ts";
import { dataArray } from "../core/data.ts";
import type { CompiledKernel } from "./kernel.ts";
import { launch } from "./launch.ts";
import { type PlanTable, type Section, uploadTable } from "./plan_table.ts";
import type { FillPlan } from "./fill.ts";
import { nanWord } from "./wgsl_data.ts";
import { finiteIssues, FLAGS_BYTES } from "./finite_check.ts";
import { bindGpuPlan } from "./plan_bind.ts";
import { envOneOf, type EnvSetting, readSetting } from "../core/env.ts";

export { bindGpuPlan, bindStats, type BoundGpuPlan } from "./plan_bind.ts";

/** What a binding of a planned call refers to. */
export type BindRef =
  | { table: Section }
  | { io: "query" | "key" | "value" | "out" | "lse" | "flags" }
  | { scratch: string }
  /** The device's own buffer of that name (gpu/persistent_buffers.ts), at least `bytes`. */
  | { persistent: string; bytes: number };

/** One planned dispatch. */
export interface PlannedCall {
  name: string;
  kernel: CompiledKernel;
  bind: Record<string, BindRef>;
  /** Also bind the cache's chunk buffers (`k0..`, `v0..`). */
  cache?: boolean;
  grid: readonly [number, number];
  /** Dispatch the workgroups this buffer holds (at offset 0) instead of `grid`. */
  indirect?: BindRef;
}

/** A GPU backend's plan. */
export interface GpuPlan extends PlanContract {
  readonly ctx: GpuContext;
  /** Every Params block and metadata table (gpu/plan_table.ts), written by each call. */
  readonly table: Uint8Array<ArrayBuffer>;
  /** Returns the table's lent memory (gpu/plan_builder.ts disposeGpuPlan); idempotent. */
  readonly dispose?: () => void;
  /**
   * The calls check the batch's query/key/value for NaN and infinity first, and write the
   * cache only when they are finite (gpu/finite_check.ts): a call with one fails with the
   * validator's 422 and changes nothing. The service leaves large batches' scans to such plans.
   */
  readonly checks_finite: boolean;
  readonly calls: PlannedCall[];
  /** Bytes of each scratch buffer by name. */
  readonly scratch: Record<string, number>;
  readonly out_bytes: number;
  readonly lse_bytes: number;
  /** Readable summary of the kernels (for timings and the bench). */
  readonly kernels: string[];
  /** The cache chunk layout the kernels were built for (chunkKeyOf), or null. */
  readonly cache_layout: string | null;
  /** Counts worth reporting, e.g. decode_items, decode_rows, prefill_tiles. */
  readonly info: Record<string, number>;
  readonly plan_ms: number;
}

/** The fill calls that poison the output and (unless null) the LSE buffers of a plan. */
export function poisonCalls(fillOut: FillPlan, fillLse: FillPlan | null): PlannedCall[] {
  const calls: PlannedCall[] = [
    {
      name: "poison",
      kernel: fillOut.kernel,
      bind: { P: { table: fillOut.params }, dst: { io: "out" } },
      grid: fillOut.grid,
    },
  ];
  if (fillLse) {
    calls.push({
      name: "poison",
      kernel: fillLse.kernel,
      bind: { P: { table: fillLse.params }, dst: { io: "lse" } },
      grid: fillLse.grid,
    });
  }
  return calls;
}

/** Words of a dtype's output and their NaN pattern. */
export function outputWords(dtype: DType, elements: number): { words: number; pattern: number } {
  return { words: Math.ceil((elements * bytesPerElement(dtype)) / 4), pattern: nanWord(dtype) };
}

/** A buffer of its own holding `p`'s table (benches that bind a plan's calls themselves). */
export function uploadPlanTable(p: GpuPlan): PlanTable {
  return uploadTable(p.ctx, p.table, "plan.table");
}

/** How a forward's dispatches are timed: see {@link gpuTiming}. */
export type GpuTiming = "calls" | "total" | "sampled" | "off";

/** `ATTN_GPU_TIMING`: one of sampled (the default), total, calls, off. */
export const GPU_TIMING_SETTING: EnvSetting<GpuTiming> = {
  name: "ATTN_GPU_TIMING",
  unset: "sampled",
  parse: (text) => envOneOf("ATTN_GPU_TIMING", text, ["sampled", "total", "calls", "off"]),
};

let timing: GpuTiming | undefined;

/**
 * How a forward's dispatches are timed (gpu/launch.ts), by `ATTN_GPU_TIMING`: every call runs
 * them all in one compute pass; `sampled` (the default) times the first call of a plan's call
 * list and then one in {@link GPU_TIMING_SAMPLE} (`gpu`; the others carry no `gpu` timing:
 * timestamp writes, their resolve and copy cost about 35 us of host time a call on Dawn over
 * lavapipe), `total` times every call, `off` none; `calls` gives each dispatch its own timed
 * pass (`gpu_<name>`, for profiling the kernels). Read once, at the first forward call run (a
 * bad value fails that call with an EnvValueError naming it, and each later one until it
 * reads a good value; the server refuses it at start-up, server/serve_env.ts).
 */
export function gpuTiming(): GpuTiming {
  return timing ??= readSetting(GPU_TIMING_SETTING);
}

/** Under `sampled` timing, one forward call in this many is timed on the device. */
export const GPU_TIMING_SAMPLE = 16;
/** Forward calls per call list (plans of a decode step's shape share one: gpu/plan_builder.ts). */
const callCounts = new WeakMap<PlannedCall[], number>();

/** The launch timing of the next call of `p` (see {@link gpuTiming}). */
function nextTiming(p: GpuPlan): "calls" | "total" | "none" {
  const t = gpuTiming();
  if (t === "calls" || t === "total") return t;
  if (t === "off") return "none";
  const n = callCounts.get(p.calls) ?? 0;
  callCounts.set(p.calls, n + 1);
  return n % GPU_TIMING_SAMPLE === 0 ? "total" : "none";
}

/** Runs a plan on a batch's tensors (see the module doc). */
export async function runGpuPlan(
  p: GpuPlan,
  b: ValidBatch,
  ctx: GpuContext | null,
  opts: RunOptions = {},
): Promise<ForwardResult> {
  const gpu = ctx ?? p.ctx;
  if (gpu.lost || gpu.device !== p.ctx.device) {
    throw new DeviceUnavailableError("the WebGPU device of this plan was lost");
  }
  gpuTiming(); // read before anything is bound: a bad ATTN_GPU_TIMING fails here
  const t0 = performance.now();
  const bound = bindGpuPlan(p, b, gpu);
  const bind = performance.now() - t0;
  try {
    const reads = [{ buffer: bound.out, bytes: p.out_bytes }];
    if (b.return_lse) reads.push({ buffer: bound.lse, bytes: p.lse_bytes });
    if (bound.flags) reads.push({ buffer: bound.flags, bytes: FLAGS_BYTES });
    const r = await launch(gpu, {
      label: "forward",
      uploads: bound.uploads,
      clears: bound.clears,
      calls: bound.calls,
      reads,
      signal: opts.signal,
      onSubmitted: opts.onSubmitted,
      timing: nextTiming(p),
      lend: opts.lendReadback === true,
    });
    bound.tableWritten();
    if (bound.flags) {
      const issues = finiteIssues(r.parts[reads.length - 1], b);
      if (issues.length > 0) {
        r.release();
        throw invalidBatch(issues);
      }
    }
    const out = r.parts[0];
    const lse = r.parts[1];
    return {
      output: dataArray(b.dtype, out),
      lse: b.return_lse ? new Float32Array(lse.buffer, lse.byteOffset, p.lse_bytes / 4) : null,
      release: r.release,
      timings: {
        plan: p.plan_ms,
        bind,
        encode: r.host.encode,
        encode_upload: r.host.upload,
        encode_record: r.host.record,
        submit: r.host.submit,
        gpu_and_readback: r.host.wait,
        readback_map: r.host.map,
        readback_copy: r.host.copy,
        ...Object.fromEntries(
          Object.entries(r.gpu).map(([k, v]) => [k === "gpu" ? "gpu" : `gpu_${k}`, v]),
        ),
      },
    };
  } finally {
    bound.release();
  }
}
