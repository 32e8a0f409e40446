/**
 * The plan format every GPU backend produces, and the one `run` that executes it (plan on
 * metadata, run on tensors, after FlashInfer). A {@link GpuPlan} is built from a batch's shape
 * alone: compiled kernels, one table (every Params block and metadata table, as bytes), the
 * calls in order with their bindings named symbolically, and the sizes of the per-call
 * buffers. A plan owns no GPU memory. A plan for a large batch checks the data's finiteness
 * on the device first and writes the cache only when it holds (gpu/finite_check.ts); a bad
 * call then fails with the validator's 422 after the readback, its cache unchanged.
 * {@link runGpuPlan} acquires pooled buffers for the table and the call's tensors, output, LSE
 * and scratch, writes the table and the
 * query/key/value bytes as they came (one write each), poisons the outputs, binds (bind groups
 * are cached by buffer, gpu/bind_groups.ts, so a steady state creates none), dispatches
 * everything in one compute pass of one submission (see {@link GPU_TIMING}) and reads output
 * and LSE back with one `mapAsync`, into lent host memory: the result's arrays are views of
 * it until `ForwardResult.release()`.
 * The output comes back in the batch dtype; nothing is converted on the host.
 * @module
 */
import { DeviceUnavailableError, invalidBatch, ServiceError } from "../core/errors.ts";
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
import { poolOf } from "./buffer_pool.ts";
import type { CompiledKernel } from "./kernel.ts";
import { type Bound, entries, type KernelCall, launch } from "./launch.ts";
import { bindGroupsOf } from "./bind_groups.ts";
import { type PlanTable, type Section, TABLE_USAGE, uploadTable } from "./plan_table.ts";
import { GpuKvCache } from "./kv_cache.ts";
import type { FillPlan } from "./fill.ts";
import { nanWord } from "./wgsl_data.ts";
import { persistentBuffer } from "./persistent_buffers.ts";
import { ARGS_BYTES, CLEAR_FLAGS, finiteIssues, FLAGS_BYTES } from "./finite_check.ts";

/** What a binding of a planned call refers to. */
export type BindRef =
  | { table: Section }
  | { io: "query" | "key" | "value" | "out" | "lse" | "flags" | "args" }
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

/**
 * How a forward's dispatches are timed (gpu/launch.ts), by `ATTN_GPU_TIMING`: every call runs
 * them all in one compute pass; `sampled` (the default) times the first call of a plan's call
 * list and then one in {@link GPU_TIMING_SAMPLE} (`gpu`; the others carry no `gpu` timing:
 * timestamp writes, their resolve and copy cost about 35 us of host time a call on Dawn over
 * lavapipe), `total` times every call, `off` none; `calls` gives each dispatch its own timed
 * pass (`gpu_<name>`, for profiling the kernels).
 */
export const GPU_TIMING: "calls" | "total" | "sampled" | "off" = (() => {
  let v: string | undefined;
  try {
    v = Deno.env.get("ATTN_GPU_TIMING");
  } catch { /* no --allow-env: the default */ }
  return v === "calls" || v === "total" || v === "off" ? v : "sampled";
})();

/** Under `sampled` timing, one forward call in this many is timed on the device. */
export const GPU_TIMING_SAMPLE = 16;
/** Forward calls per call list (plans of a decode step's shape share one: gpu/plan_builder.ts). */
const callCounts = new WeakMap<PlannedCall[], number>();

/** The launch timing of the next call of `p` (see {@link GPU_TIMING}). */
function nextTiming(p: GpuPlan): "calls" | "total" | "none" {
  if (GPU_TIMING === "calls" || GPU_TIMING === "total") return GPU_TIMING;
  if (GPU_TIMING === "off") return "none";
  const n = callCounts.get(p.calls) ?? 0;
  callCounts.set(p.calls, n + 1);
  return n % GPU_TIMING_SAMPLE === 0 ? "total" : "none";
}

const STORAGE_IN = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
const STORAGE_OUT = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
const FLAGS_USAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
const ARGS_USAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.INDIRECT;

/** A plan bound to one batch's buffers (see {@link bindGpuPlan}). */
export interface BoundGpuPlan {
  /**
   * The uploads: the plan's table (unless its buffer holds it already, see
   * {@link BoundGpuPlan.tableWritten}), then query/key/value.
   */
  uploads: { buffer: GPUBuffer; data: Uint8Array }[];
  /**
   * Records that the table's buffer now holds the plan's table: call it once the launch that
   * wrote it went through, and a later call of the plan that gets the same pooled buffer (the
   * layers of an engine step) skips the table's upload.
   */
  tableWritten(): void;
  /** The plan's calls with every binding resolved. */
  calls: KernelCall[];
  /** The output and LSE buffers, and the finiteness flags when the plan checks. */
  out: GPUBuffer;
  lse: GPUBuffer;
  flags: GPUBuffer | null;
  /** Returns the pooled buffers. */
  release(): void;
}

/** The device-owned buffers a plan binds (gpu/persistent_buffers.ts), found once per plan. */
const persistentRefs = new WeakMap<PlannedCall[], { persistent: string; bytes: number }[]>();
function persistentRefsOf(p: GpuPlan): { persistent: string; bytes: number }[] {
  let l = persistentRefs.get(p.calls);
  if (!l) {
    l = [];
    for (const c of p.calls) {
      for (const r of [...Object.values(c.bind), ...(c.indirect ? [c.indirect] : [])]) {
        if ("persistent" in r) l.push(r);
      }
    }
    persistentRefs.set(p.calls, l);
  }
  return l;
}

/** Each planned call's bindings as a list, built once per plan (a plan serves many calls). */
const bindLists = new WeakMap<PlannedCall[], [string, BindRef][][]>();
function bindListsOf(p: GpuPlan): [string, BindRef][][] {
  let l = bindLists.get(p.calls);
  if (!l) bindLists.set(p.calls, l = p.calls.map((c) => Object.entries(c.bind)));
  return l;
}

/** The buffers a plan's symbolic bindings name, for one call. */
interface CallBuffers {
  table: GPUBuffer;
  io: Record<string, GPUBuffer>;
  scratch: Record<string, GPUBuffer>;
  persistent: Map<string, GPUBuffer>;
}

/** `p`'s calls with every binding resolved to `bufs` and each call's bind group. */
function bindCalls(
  p: GpuPlan,
  gpu: GpuContext,
  cache: GpuKvCache | null,
  bufs: CallBuffers,
): KernelCall[] {
  const resolve = (r: BindRef): Bound => {
    if ("table" in r) return { buffer: bufs.table, offset: r.table.offset, size: r.table.size };
    if ("scratch" in r) return bufs.scratch[r.scratch];
    if ("persistent" in r) return bufs.persistent.get(r.persistent)!;
    const buf = bufs.io[r.io];
    if (!buf) throw new Error(`the plan binds ${r.io}, which this batch does not carry`);
    return buf;
  };
  const groups = bindGroupsOf(gpu.device);
  const binds = bindListsOf(p);
  return p.calls.map((c, i) => {
    const bind: Record<string, Bound> = {};
    for (const [k, r] of binds[i]) bind[k] = resolve(r);
    if (c.cache) Object.assign(bind, cache!.bindMap());
    const call: KernelCall = { name: c.name, kernel: c.kernel, bind, grid: c.grid };
    if (c.indirect) {
      const r = resolve(c.indirect);
      call.indirect = "usage" in r ? { buffer: r, offset: 0 } : { buffer: r.buffer, offset: 0 };
    }
    call.group = groups.get(c.kernel.layout, entries(call), c.name);
    return call;
  });
}

/**
 * The calls a plan's call list was last bound to, with their bind groups, and every buffer
 * they bind in a fixed order: a call of the same plan, or of a later plan sharing its list
 * (gpu/plan_builder.ts: a decode step whose decomposition did not change), that gets the same
 * buffers (the pool hands them back in steady state; the layers of an engine step share one
 * plan) reuses them as they are, without resolving a binding or building a bind-group key.
 * The table's bytes are the plan's own; only where they go is shared.
 */
interface BoundCalls {
  buffers: GPUBuffer[];
  calls: KernelCall[];
}
const lastBound = new WeakMap<PlannedCall[], BoundCalls>();
const boundStats = { bound: 0, reused: 0, reused_groups: 0, tables_kept: 0 };

/**
 * The plan table a pooled table buffer holds, as recorded by {@link BoundGpuPlan.tableWritten}
 * (tables are immutable, and no kernel writes one; a binding that uploads another table into
 * the buffer forgets the record first, so a launch that does not report back leaves none).
 */
const tableHolds = new WeakMap<GPUBuffer, Uint8Array>();

/**
 * Counters of {@link bindGpuPlan} (tests, the profile): bindings resolved anew, bindings that
 * reused a plan's last calls as they were, the bind groups those carried, and table uploads
 * skipped because the buffer held the plan's table.
 */
export function bindStats(): {
  bound: number;
  reused: number;
  reused_groups: number;
  tables_kept: number;
} {
  return { ...boundStats };
}

function sameBuffers(a: GPUBuffer[], b: GPUBuffer[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Binds plan `p` to batch `b` on `gpu`: pooled buffers for the plan's table and the call's
 * tensors, output, LSE and scratch, the uploads of the table and of the query/key/value bytes
 * as they came, and every call's bindings with its bind group (the last binding's calls when
 * every buffer is the same, {@link BoundCalls}). runGpuPlan
 * launches the result; the bench launches its calls without a readback to time the kernels.
 */
export function bindGpuPlan(p: GpuPlan, b: ValidBatch, gpu: GpuContext): BoundGpuPlan {
  const cache = b.cache;
  if (cache !== null) {
    if (!(cache instanceof GpuKvCache)) {
      throw new ServiceError(
        `a WebGPU backend needs a webgpu KV cache, got storage "${cache.storage}"`,
        { status: 422, code: "cache_storage_mismatch", extra: { storage: cache.storage } },
      );
    }
    cache.assertUsable(gpu);
    if (cache.chunkKey !== p.cache_layout) {
      throw new Error(
        `the cache is laid out as ${cache.chunkKey} but the plan was built for ${p.cache_layout}`,
      );
    }
  }
  const pool = poolOf(gpu);
  const owned: GPUBuffer[] = [];
  const take = (bytes: number, usage: number, label: string) => {
    const buf = pool.acquire(Math.max(16, bytes), usage, label);
    owned.push(buf);
    return buf;
  };
  try {
    const table = take(p.table.byteLength, TABLE_USAGE, "plan.table");
    const io: Record<string, GPUBuffer> = {
      out: take(p.out_bytes, STORAGE_OUT, "out"),
      lse: take(p.lse_bytes, STORAGE_OUT, "lse"),
    };
    const uploads: { buffer: GPUBuffer; data: Uint8Array }[] = [];
    if (tableHolds.get(table) === p.table) boundStats.tables_kept++;
    else {
      tableHolds.delete(table);
      uploads.push({ buffer: table, data: p.table });
    }
    if (p.checks_finite) {
      io.flags = take(FLAGS_BYTES, FLAGS_USAGE, "flags");
      io.args = take(ARGS_BYTES, ARGS_USAGE, "args");
      uploads.push({ buffer: io.flags, data: CLEAR_FLAGS });
    }
    for (const name of ["query", "key", "value"] as const) {
      const t = b[name];
      if (!t) continue;
      io[name] = take(t.bytes.byteLength, STORAGE_IN, name);
      uploads.push({ buffer: io[name], data: t.bytes });
    }
    const scratch: Record<string, GPUBuffer> = {};
    for (const [name, bytes] of Object.entries(p.scratch)) {
      scratch[name] = take(bytes, GPUBufferUsage.STORAGE, name);
    }
    const persistent = new Map<string, GPUBuffer>();
    for (const r of persistentRefsOf(p)) {
      persistent.set(r.persistent, persistentBuffer(gpu, r.persistent, r.bytes));
    }
    // Every buffer a call may bind, in a fixed order (the same plan binds the same names).
    const buffers = [...owned, ...persistent.values()];
    if (cache !== null) {
      const c = cache as GpuKvCache;
      buffers.push(...c.keyBuffers, ...c.valueBuffers);
    }
    const last = lastBound.get(p.calls);
    const calls = last && sameBuffers(last.buffers, buffers)
      ? last.calls
      : bindCalls(p, gpu, cache as GpuKvCache | null, { table, io, scratch, persistent });
    if (calls !== last?.calls) {
      lastBound.set(p.calls, { buffers, calls });
      boundStats.bound++;
    } else {
      boundStats.reused++;
      boundStats.reused_groups += calls.length;
    }
    return {
      uploads,
      calls,
      out: io.out,
      lse: io.lse,
      flags: io.flags ?? null,
      tableWritten: () => tableHolds.set(table, p.table),
      release: () => pool.release(...owned),
    };
  } catch (e) {
    pool.release(...owned);
    throw e;
  }
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
      calls: bound.calls,
      reads,
      signal: opts.signal,
      timing: nextTiming(p),
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
