/**
 * Writing new K/V rows into a {@link GpuKvCache} (vLLM's reshape_and_cache) with
 * `wgsl/cache_write.wgsl`, described as the kernel entry {@link CACHE_WRITE}: rows uploaded
 * in their data dtype, rounded on the GPU to the storage dtype in integer arithmetic
 * (byte-exact with core/dtype.ts), slot -1 skipped. A backend's plan compiles it and packs its
 * Params ({@link planCacheWrite}); its run dispatches it in the same submission as the
 * attention kernels ({@link cacheWriteCall}), so one submit writes then attends. The batch
 * was validated (service/validate.ts): rows, slots and their range are not re-checked here.
 * The WGSL that packs rows into storage words ({@link DIV_RN}, `pack_word`) lives in
 * gpu/cache_write_pack.ts; DIV_RN is re-exported here.
 * @module
 */
import type { DataArray, DType, GpuContext, KvCacheSpec } from "../core/types.ts";
import { type GpuKvCache, type KvChunkGeometry, kvChunkGeometry } from "./kv_cache.ts";
import { getKernel, type KernelDef, packUniforms } from "./kernel.ts";
import { type Bound, type KernelCall, launch } from "./launch.ts";
import { dispatchSize } from "./batch_buffers.ts";
import { poolOf } from "./buffer_pool.ts";
import { elementsPerWord, kvAccessorFns, kvBindingDecls, loadWgsl, specialize } from "./wgsl.ts";
import { dataLoads } from "./wgsl_data.ts";
import { type Section, TableBuilder } from "./plan_table.ts";
import type { StorageDType } from "../core/types.ts";
import { FLAG_CLEAR } from "./finite_check.ts";
import { packFn } from "./cache_write_pack.ts";

export { DIV_RN } from "./cache_write_pack.ts";

/** Workgroup size of the cache-write kernel. */
export const CACHE_WRITE_WG = 64;

/** Compile-time values of one cache-write variant. */
export interface CacheWriteConsts {
  [k: string]: string | number | boolean;
  storage: StorageDType;
  dtype: DType;
  head: number;
  nhd: boolean;
  nchunk: number;
  /**
   * Binds the finiteness flags of the call (gpu/finite_check.ts) and writes nothing unless
   * every one is clear: a direct dispatch behind the check (an indirect one cost Dawn 72 us to
   * record and 383 us more submit on the H200: bench/NOTES.md v0.9).
   */
  gated: boolean;
}

/** The cache-write kernel, as data. */
export const CACHE_WRITE: KernelDef<CacheWriteConsts> = {
  name: "cache_write",
  uniforms: [
    ["num_rows", "u32"],
    ["num_kv_heads", "u32"],
    ["block_size", "u32"],
    ["nwg_x", "u32"],
    ["k_scale", "f32"],
    ["v_scale", "f32"],
    ["block_words", "u32"],
    ["blocks_per_chunk", "u32"],
  ],
  bindings: (c) => [
    { name: "P", kind: "uniform" },
    { name: "key_new", kind: "read", type: "array<u32>" },
    { name: "value_new", kind: "read", type: "array<u32>" },
    { name: "slots", kind: "read", type: "array<i32>" },
    ...(c.gated ? [{ name: "flags", kind: "read" as const, type: "array<u32, 4>" }] : []),
    ...kvBindingDecls(c.nchunk, "read_write"),
  ],
  async source(c) {
    const k = dataLoads("key_new", c.dtype, 1), v = dataLoads("value_new", c.dtype, 1);
    return specialize(await loadWgsl("cache_write.wgsl"), {
      WG: CACHE_WRITE_WG,
      HEAD: c.head,
      EPW: elementsPerWord(c.storage),
      NHD: c.nhd,
      GATE: c.gated
        ? `if (${[0, 1, 2].map((i) => `flags[${i}] != ${FLAG_CLEAR}u`).join(" || ")}) {
    return; // a NaN or infinity in the call: the cache stays as it was
  }`
        : "",
      ROUND: await loadWgsl("round.wgsl"),
      SRC: `${k.code}${v.code}fn src_bits(is_v: bool, i: u32) -> u32 {
  if (is_v) {
    return value_new_bits(i);
  }
  return key_new_bits(i);
}
`,
      PACK: packFn(c.storage),
      KV: kvAccessorFns({
        nchunk: c.nchunk,
        blocksPerChunk: "P.blocks_per_chunk",
        blockWords: "P.block_words",
        access: "read_write",
      }),
    });
  },
};

/** The variant for a cache of `spec` laid out as `g`, and rows of data dtype `dtype`. */
export function cacheWriteConsts(
  spec: KvCacheSpec,
  g: KvChunkGeometry,
  dtype: DType,
  gated = false,
): CacheWriteConsts {
  return {
    gated,
    storage: g.storage_dtype,
    dtype,
    head: spec.head_size,
    nhd: spec.layout === "NHD",
    nchunk: g.nchunk,
  };
}

/** A planned cache write: the compiled kernel, its Params and slot sections, its grid. */
export interface CacheWritePlan {
  kernel: Awaited<ReturnType<typeof getKernel>>;
  params: Section;
  slots: Section;
  grid: [number, number];
}

/**
 * Plans the write of key/value rows (one per slot_mapping entry `slots`) into a cache of
 * `spec` on `ctx`'s device, adding its sections to `table`. null when there is nothing to write.
 * `gated`: the write binds the call's finiteness flags and writes only when they are clear.
 */
export async function planCacheWrite(
  ctx: GpuContext,
  spec: KvCacheSpec,
  dtype: DType,
  slots: Int32Array,
  scales: { k_scale: number; v_scale: number },
  table: TableBuilder,
  g: KvChunkGeometry = kvChunkGeometry(ctx, spec),
  gated = false,
): Promise<CacheWritePlan | null> {
  const rows = slots.length;
  if (rows === 0) return null;
  const kernel = await getKernel(ctx, CACHE_WRITE, cacheWriteConsts(spec, g, dtype, gated));
  const wpr = spec.head_size / elementsPerWord(g.storage_dtype);
  const grid = dispatchSize(ctx, Math.ceil((2 * rows * spec.num_kv_heads * wpr) / CACHE_WRITE_WG));
  const fp8 = g.storage_dtype === "fp8_e4m3" || g.storage_dtype === "fp8_e5m2";
  const params = table.add(packUniforms(CACHE_WRITE, {
    num_rows: rows,
    num_kv_heads: spec.num_kv_heads,
    block_size: spec.block_size,
    nwg_x: grid[0],
    k_scale: fp8 ? scales.k_scale : 1,
    v_scale: fp8 ? scales.v_scale : 1,
    block_words: g.block_words,
    blocks_per_chunk: g.blocks_per_chunk,
  }));
  return { kernel, params, slots: table.add(slots), grid };
}

/** The dispatch of a planned write: `table` binds its sections, `key`/`value` the rows. */
export function cacheWriteCall(
  p: CacheWritePlan,
  bindTable: (s: Section) => Bound,
  cache: GpuKvCache,
  key: Bound,
  value: Bound,
): KernelCall {
  return {
    name: "cache_write",
    kernel: p.kernel,
    bind: {
      P: bindTable(p.params),
      key_new: key,
      value_new: value,
      slots: bindTable(p.slots),
      ...cache.bindMap(),
    },
    grid: p.grid,
  };
}

/** Rows to write on their own: key/value `[num_rows, num_kv_heads, head_size]`, one slot each. */
export interface CacheWriteRows {
  key: DataArray;
  value: DataArray;
  /** [num_rows]; -1 = padding, nothing written. Must be in range (validated by the caller). */
  slot_mapping: Int32Array;
  /** fp8 caches store x / scale (default 1). */
  k_scale?: number;
  v_scale?: number;
}

/** Writes `rows` into `cache` in its own submission and waits for the GPU to finish. */
export async function writeCache(
  ctx: GpuContext,
  cache: GpuKvCache,
  rows: CacheWriteRows,
): Promise<void> {
  cache.assertUsable(ctx);
  const table = new TableBuilder();
  const p = await planCacheWrite(
    ctx,
    cache.spec,
    rows.key.dtype,
    rows.slot_mapping,
    {
      k_scale: rows.k_scale ?? 1,
      v_scale: rows.v_scale ?? 1,
    },
    table,
    cache.geometry,
  );
  if (!p) return;
  const t = table.upload(ctx, "cache_write.table");
  const pool = poolOf(ctx);
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
  const k = pool.acquire(rows.key.bytes.byteLength, usage, "cw.key");
  const v = pool.acquire(rows.value.bytes.byteLength, usage, "cw.value");
  try {
    await launch(ctx, {
      label: "cache_write",
      uploads: [{ buffer: k, data: rows.key.bytes }, { buffer: v, data: rows.value.bytes }],
      calls: [cacheWriteCall(p, t.bind, cache, k, v)],
      reads: [],
    });
  } finally {
    pool.release(k, v);
    t.buffer.destroy();
  }
}
