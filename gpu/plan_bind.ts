/**
 * Binding a GPU plan to one call's buffers ({@link bindGpuPlan}): pooled buffers for the plan's
 * table and the call's tensors, output, LSE and scratch, the uploads, and every planned call
 * with its bindings resolved and its bind group. What a steady state reuses: a call list bound
 * again to the same buffers keeps its resolved calls and bind groups ({@link BoundCalls}), and a
 * pooled table buffer that holds the plan's table is not written again
 * ({@link BoundGpuPlan.tableWritten}). A request that carried query, key and value back to back
 * in one body ({@link packedInputs}) uploads them in one write, bound as ranges of one buffer.
 * gpu/gpu_plan.ts runs the result.
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import type { GpuContext, ValidBatch } from "../core/types.ts";
import { poolOf } from "./buffer_pool.ts";
import { INPUTS, packedInputs } from "./packed_inputs.ts";
import { BOUND_VARIANTS, type BoundCalls, boundList, findBound } from "./bound_calls.ts";
import { type Bound, entries, type KernelCall } from "./launch.ts";
import { bindGroupsOf } from "./bind_groups.ts";
import { TABLE_USAGE } from "./plan_table.ts";
import { GpuKvCache } from "./kv_cache.ts";
import { persistentBuffer } from "./persistent_buffers.ts";
import { FLAGS_BYTES } from "./finite_check.ts";
import type { BindRef, GpuPlan, PlannedCall } from "./gpu_plan.ts";

export { type PackedInputs, packedInputs } from "./packed_inputs.ts";

const STORAGE_IN = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
const STORAGE_OUT = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC;
const FLAGS_USAGE = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;

/** A plan bound to one batch's buffers (see {@link bindGpuPlan}). */
export interface BoundGpuPlan {
  /**
   * The uploads: the plan's table (unless its buffer holds it already, see
   * {@link BoundGpuPlan.tableWritten}), then query/key/value.
   */
  uploads: { buffer: GPUBuffer; data: Uint8Array }[];
  /** Buffers the launch zeroes before the calls: the finiteness flags when the plan checks. */
  clears: GPUBuffer[];
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
  io: Record<string, Bound>;
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

/**
 * Binds plan `p` to batch `b` on `gpu`: pooled buffers for the plan's table and the call's
 * tensors, output, LSE and scratch, the uploads of the table and of the query/key/value bytes
 * as they came, and every call's bindings with its bind group (the last binding's calls when
 * every buffer is the same, {@link BoundCalls}). runGpuPlan
 * launches the result; the bench launches its calls without a readback to time the kernels.
 */
export function bindGpuPlan(p: GpuPlan, b: ValidBatch, gpu: GpuContext): BoundGpuPlan {
  const cache = gpuCacheOf(p, b, gpu);
  const pool = poolOf(gpu);
  const owned: GPUBuffer[] = [];
  // The buffers this plan's last call on this cache had, where free (a cache's calls then bind
  // the same buffers, so its kept state is found, also while other caches' calls are in flight).
  const kept = boundList(p.calls, cache);
  const had = kept[0]?.owned;
  const take: Take = (bytes, usage, label) => {
    const buf = pool.acquire(Math.max(16, bytes), usage, label, had?.[owned.length]);
    owned.push(buf);
    return buf;
  };
  try {
    const table = take(p.table.byteLength, TABLE_USAGE, "plan.table");
    const out = take(p.out_bytes, STORAGE_OUT, "out"), lse = take(p.lse_bytes, STORAGE_OUT, "lse");
    const io: Record<string, Bound> = { out, lse };
    const uploads: { buffer: GPUBuffer; data: Uint8Array }[] = [];
    if (tableHolds.get(table) === p.table) boundStats.tables_kept++;
    else {
      tableHolds.delete(table);
      uploads.push({ buffer: table, data: p.table });
    }
    const flags = p.checks_finite ? take(FLAGS_BYTES, FLAGS_USAGE, "flags") : null;
    if (flags) io.flags = flags;
    const ranges = bindInputs(b, gpu, take, io, uploads);
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
    if (cache !== null) buffers.push(...cache.keyBuffers, ...cache.valueBuffers);
    const calls = reusedCalls(kept, buffers, ranges) ??
      keepBound(kept, {
        buffers,
        owned,
        ranges,
        calls: bindCalls(p, gpu, cache, { table, io, scratch, persistent }),
      });
    return {
      uploads,
      clears: flags ? [flags] : [],
      calls,
      out,
      lse,
      flags,
      tableWritten: () => tableHolds.set(table, p.table),
      release: () => pool.release(...owned),
    };
  } catch (e) {
    pool.release(...owned);
    throw e;
  }
}

/** Takes a pooled buffer of at least `bytes` for the call being bound (it keeps the list). */
type Take = (bytes: number, usage: number, label: string) => GPUBuffer;

/**
 * The batch's cache as a WebGPU cache usable on `gpu` and laid out as plan `p` expects, or null
 * when the call has none.
 * @throws ServiceError 422 `cache_storage_mismatch` for a cache of another storage; Error when
 * its device is gone or its layout is not the plan's.
 */
function gpuCacheOf(p: GpuPlan, b: ValidBatch, gpu: GpuContext): GpuKvCache | null {
  const cache = b.cache;
  if (cache === null) return null;
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
  return cache;
}

/**
 * Binds the call's query, key and value into `io` and queues their uploads: ranges of one buffer
 * where the body carried them back to back ({@link packedInputs}), else a buffer each. Returns
 * the ranges (offset, bytes pairs; empty for separate buffers), part of the kept state's key.
 */
function bindInputs(
  b: ValidBatch,
  gpu: GpuContext,
  take: Take,
  io: Record<string, Bound>,
  uploads: { buffer: GPUBuffer; data: Uint8Array }[],
): number[] {
  const packed = packedInputs(
    b,
    gpu.limits.minStorageBufferOffsetAlignment ?? 256,
    gpu.limits.maxBufferSize ?? 2 ** 28,
  );
  const ranges: number[] = [];
  if (packed) {
    const buffer = take(packed.span.byteLength, STORAGE_IN, "inputs");
    uploads.push({ buffer, data: packed.span });
    for (const { name, offset, bytes } of packed.at) {
      io[name] = { buffer, offset, size: bytes };
      ranges.push(offset, bytes);
    }
  } else {
    for (const name of INPUTS) {
      const t = b[name];
      if (!t) continue;
      const buffer = take(t.bytes.byteLength, STORAGE_IN, name);
      io[name] = buffer;
      uploads.push({ buffer, data: t.bytes });
    }
  }
  return ranges;
}

/** The kept calls bound to the same buffers and ranges (counted as reused), or null. */
function reusedCalls(
  kept: BoundCalls[],
  buffers: GPUBuffer[],
  ranges: number[],
): KernelCall[] | null {
  const found = findBound(kept, buffers, ranges);
  if (!found) return null;
  boundStats.reused++;
  boundStats.reused_groups += found.calls.length;
  return found.calls;
}

/** Keeps a newly bound state first in the list (at most BOUND_VARIANTS); returns its calls. */
function keepBound(kept: BoundCalls[], state: BoundCalls): KernelCall[] {
  kept.unshift(state);
  if (kept.length > BOUND_VARIANTS) kept.length = BOUND_VARIANTS;
  boundStats.bound++;
  return state.calls;
}
