/**
 * Writing new K/V rows into a {@link GpuKvCache} (vLLM's reshape_and_cache) with
 * `wgsl/cache_write.wgsl`: rows uploaded as f32, rounded on the GPU to the storage dtype in
 * integer arithmetic (byte-exact with core/dtype.ts), slot -1 skipped. Record it on the same
 * encoder as the attention kernel so one submission writes then attends.
 * @module
 */
import { invalidBatch } from "../core/errors.ts";
import type { GpuContext, StorageDType } from "../core/types.ts";
import { BatchBuffers, dispatchSize, UniformBuilder } from "./batch_buffers.ts";
import type { GpuKvCache } from "./kv_cache.ts";
import { getComputePipeline } from "./pipelines.ts";
import { dtypeTag, elementsPerWord, kvAccessors, loadWgsl, specialize } from "./wgsl.ts";

/** Workgroup size of the cache-write kernel. */
export const CACHE_WRITE_WG = 64;

/** The rows to write: key/value `[num_rows, num_kv_heads, head_size]`, one slot per row. */
export interface CacheWriteRows {
  key: Float32Array;
  value: Float32Array;
  /** [num_rows]; -1 (any negative) = padding, nothing written. */
  slot_mapping: Int32Array;
  /** fp8 caches store x / scale (default 1). */
  k_scale?: number;
  v_scale?: number;
}

function packFn(d: StorageDType): string {
  const head = "fn pack_word(x: vec4<u32>, scale: f32) -> u32 {\n";
  switch (d) {
    case "float32":
      return `${head}  return x.x;\n}\n`;
    case "float16":
      return `${head}  return f16_bits(x.x) | (f16_bits(x.y) << 16u);\n}\n`;
    case "bfloat16":
      return `${head}  return bf16_bits(x.x) | (bf16_bits(x.y) << 16u);\n}\n`;
    case "fp8_e4m3":
    case "fp8_e5m2": {
      const f = d === "fp8_e4m3" ? "e4m3_bits" : "e5m2_bits";
      return `fn scaled(b: u32, scale: f32) -> u32 {
  if (scale == 1.0) {
    return b;
  }
  return bitcast<u32>(bitcast<f32>(b) / scale);
}
${head}  return ${f}(scaled(x.x, scale)) | (${f}(scaled(x.y, scale)) << 8u) |
    (${f}(scaled(x.z, scale)) << 16u) | (${f}(scaled(x.w, scale)) << 24u);
}
`;
    }
  }
}

/** The pipeline key of the cache-write kernel for `cache`, e.g. `cache_write[f16]:hd128:NHD:c1:wg64`. */
export function cacheWriteKey(cache: GpuKvCache): string {
  const g = cache.geometry;
  return `cache_write[${dtypeTag(g.storage_dtype)}]:hd${cache.spec.head_size}:` +
    `${cache.spec.layout}:c${g.nchunk}:wg${CACHE_WRITE_WG}`;
}

/** The compiled cache-write pipeline for `cache` (cached per device). */
export async function cacheWritePipeline(
  ctx: GpuContext,
  cache: GpuKvCache,
): Promise<GPUComputePipeline> {
  const g = cache.geometry;
  const code = specialize(await loadWgsl("cache_write.wgsl"), {
    WG: CACHE_WRITE_WG,
    HEAD: cache.spec.head_size,
    EPW: elementsPerWord(g.storage_dtype),
    NHD: cache.spec.layout === "NHD",
    PACK: packFn(g.storage_dtype),
    KV: kvAccessors({
      nchunk: g.nchunk,
      blocksPerChunk: "P.blocks_per_chunk",
      blockWords: "P.block_words",
      firstBinding: 4,
      access: "read_write",
    }),
  });
  return getComputePipeline(ctx, cacheWriteKey(cache), code);
}

/**
 * Checks `rows` against `cache` (lengths, slots in range).
 * @throws ServiceError 422 `invalid_batch` naming the field and value.
 */
export function validateCacheWrite(cache: GpuKvCache, rows: CacheWriteRows): number {
  const { num_kv_heads: kvh, head_size: hs, num_blocks, block_size } = cache.spec;
  const n = rows.slot_mapping.length;
  const want = n * kvh * hs;
  for (const [name, a] of [["key", rows.key], ["value", rows.value]] as const) {
    if (a.length !== want) {
      throw invalidBatch([{
        path: [name],
        message: `has ${a.length} elements, expected ${n} x ${kvh} x ${hs} = ${want}`,
      }]);
    }
  }
  const slots = num_blocks * block_size;
  for (let i = 0; i < n; i++) {
    const s = rows.slot_mapping[i];
    if (s >= slots) {
      throw invalidBatch([{
        path: ["metadata", "slot_mapping", i],
        message:
          `slot ${s} is out of range for a cache of ${num_blocks} blocks x ${block_size} slots`,
      }]);
    }
  }
  return n;
}

/**
 * Records the cache write on `encoder` (one compute pass). Buffers come from `buffers` and
 * live until it is destroyed. Returns false (recording nothing) when there are no rows.
 */
export async function encodeCacheWrite(
  ctx: GpuContext,
  encoder: GPUCommandEncoder,
  cache: GpuKvCache,
  rows: CacheWriteRows,
  buffers: BatchBuffers,
): Promise<boolean> {
  cache.assertUsable(ctx);
  const n = validateCacheWrite(cache, rows);
  const spec = cache.spec;
  if (n === 0 || spec.num_kv_heads === 0) return false;
  const pipeline = await cacheWritePipeline(ctx, cache);
  const g = cache.geometry;
  const wpr = spec.head_size / elementsPerWord(g.storage_dtype);
  const total = 2 * n * spec.num_kv_heads * wpr;
  const [wx, wy] = dispatchSize(ctx, Math.ceil(total / CACHE_WRITE_WG));
  const params = new UniformBuilder()
    .u32(n).u32(spec.num_kv_heads).u32(spec.block_size).u32(wx)
    .f32(rows.k_scale ?? 1).f32(rows.v_scale ?? 1).u32(g.block_words).u32(g.blocks_per_chunk);
  const bind = ctx.device.createBindGroup({
    label: "cache_write",
    layout: pipeline.getBindGroupLayout(0),
    entries: [
      { binding: 0, resource: { buffer: buffers.uniform(params, "cw.params") } },
      { binding: 1, resource: { buffer: buffers.storage(rows.key, "cw.key") } },
      { binding: 2, resource: { buffer: buffers.storage(rows.value, "cw.value") } },
      { binding: 3, resource: { buffer: buffers.storage(rows.slot_mapping, "cw.slots") } },
      ...cache.bindEntries(4),
    ],
  });
  const pass = encoder.beginComputePass({ label: "cache_write" });
  pass.setPipeline(pipeline);
  pass.setBindGroup(0, bind);
  pass.dispatchWorkgroups(wx, wy);
  pass.end();
  return true;
}

/** Writes `rows` into `cache` in its own submission and waits for the GPU to finish. */
export async function writeCache(
  ctx: GpuContext,
  cache: GpuKvCache,
  rows: CacheWriteRows,
): Promise<void> {
  const buffers = new BatchBuffers(ctx, "cache_write");
  try {
    const enc = ctx.device.createCommandEncoder({ label: "cache_write" });
    if (await encodeCacheWrite(ctx, enc, cache, rows, buffers)) {
      ctx.device.queue.submit([enc.finish()]);
      await ctx.device.queue.onSubmittedWorkDone();
    }
  } finally {
    buffers.destroy();
  }
}
