/**
 * How a paged KV cache splits into storage buffers: whole blocks per chunk,
 * `blocks_per_chunk = floor(min(maxStorageBufferBindingSize, maxBufferSize) / block_bytes)`, the
 * chunk count bounded by the per-stage storage-buffer budget left after a kernel's other
 * bindings ({@link KV_RESERVED_STORAGE_BINDINGS}), at most {@link MAX_KV_CHUNKS}. Caches and
 * plans both derive their layout from {@link kvChunkGeometry}, so they agree.
 * @module
 */
import { bytesPerElement, resolveStorage } from "../core/dtype.ts";
import { ServiceError } from "../core/errors.ts";
import type { GpuContext, KvCacheSpec, StorageDType } from "../core/types.ts";

/** Storage buffers a kernel that binds the cache may use besides the K/V chunks. */
export const KV_RESERVED_STORAGE_BINDINGS = 4;
/** Most buffers K (and V) may span. */
export const MAX_KV_CHUNKS = 8;

/**
 * A limit name (not WebGPU's) a GpuContext may carry to cap the bytes of one cache chunk below
 * the binding limit; tests set it to force multi-chunk caches. Caches and plans both read it,
 * so they agree on the layout.
 */
export const MAX_KV_CHUNK_BYTES = "maxKvChunkBytes";

/** How a cache is split into buffers. */
export interface KvChunkGeometry {
  storage_dtype: StorageDType;
  /** Bytes of one block of K (or V). Always a multiple of 4. */
  block_bytes: number;
  /** u32 words of one block. */
  block_words: number;
  blocks_per_chunk: number;
  /** Buffers per tensor. */
  nchunk: number;
  /** Bytes of each chunk buffer (the last may be smaller). */
  chunk_bytes: number[];
  /** Bytes of K plus V. */
  bytes: number;
}

function unprocessable(
  code: string,
  message: string,
  extra: Record<string, unknown>,
): ServiceError {
  return new ServiceError(message, { status: 422, code, extra });
}

/**
 * How `spec` would be laid out on `ctx`'s device.
 * @throws ServiceError 422 `kv_cache_too_large` when it needs more chunks than the binding
 *   budget allows; 422 `kv_cache_unaligned` when a block is not a whole number of u32 words.
 */
export function kvChunkGeometry(
  ctx: GpuContext,
  spec: KvCacheSpec,
  opts: { maxBlocksPerChunk?: number } = {},
): KvChunkGeometry {
  const storage = resolveStorage(spec.kv_cache_dtype, spec.dtype);
  const eb = bytesPerElement(storage);
  const blockBytes = spec.block_size * spec.num_kv_heads * spec.head_size * eb;
  if (blockBytes % 4 !== 0 || blockBytes === 0) {
    throw unprocessable(
      "kv_cache_unaligned",
      `a KV block of block_size ${spec.block_size} x num_kv_heads ${spec.num_kv_heads} x ` +
        `head_size ${spec.head_size} x ${eb} B (${storage}) = ${blockBytes} B is not a multiple ` +
        `of 4 bytes; GPU caches need head_size % ${4 / Math.min(4, eb)} == 0`,
      { block_bytes: blockBytes },
    );
  }
  const maxBinding = Math.min(
    ctx.limits.maxStorageBufferBindingSize ?? 134217728,
    ctx.limits.maxBufferSize ?? 268435456,
    ctx.limits[MAX_KV_CHUNK_BYTES] ?? Infinity,
  );
  const perStage = ctx.limits.maxStorageBuffersPerShaderStage ?? 8;
  const maxChunks = Math.max(
    0,
    Math.min(MAX_KV_CHUNKS, Math.floor((perStage - KV_RESERVED_STORAGE_BINDINGS) / 2)),
  );
  let bpc = Math.floor(maxBinding / blockBytes);
  if (opts.maxBlocksPerChunk !== undefined) {
    bpc = Math.min(bpc, Math.max(1, opts.maxBlocksPerChunk));
  }
  const tensorBytes = spec.num_blocks * blockBytes;
  if (bpc < 1 || maxChunks < 1) {
    throw unprocessable(
      "kv_cache_too_large",
      `one KV block of ${blockBytes} B does not fit this device's storage bindings ` +
        `(${maxBinding} B per binding, ${maxChunks} chunks per tensor)`,
      { block_bytes: blockBytes, max_binding_bytes: maxBinding },
    );
  }
  const nchunk = Math.max(1, Math.ceil(spec.num_blocks / bpc));
  if (nchunk > maxChunks) {
    throw unprocessable(
      "kv_cache_too_large",
      `a KV cache of ${spec.num_blocks} blocks needs ${tensorBytes} B per tensor (K and V each, ` +
        `${2 * tensorBytes} B in all), over this device's limit of ${maxChunks} buffers of ` +
        `${bpc * blockBytes} B (${maxChunks * bpc} blocks of ${blockBytes} B) per tensor`,
      { bytes: 2 * tensorBytes, max_bytes: 2 * maxChunks * bpc * blockBytes },
    );
  }
  const chunkBytes: number[] = [];
  for (let c = 0; c < nchunk; c++) {
    const blocks = Math.min(bpc, spec.num_blocks - c * bpc);
    chunkBytes.push(Math.max(4, blocks * blockBytes));
  }
  return {
    storage_dtype: storage,
    block_bytes: blockBytes,
    block_words: blockBytes / 4,
    blocks_per_chunk: bpc,
    nchunk,
    chunk_bytes: chunkBytes,
    bytes: 2 * tensorBytes,
  };
}

/** A key naming a chunk layout: `c1`, or `c{nchunk}x{blocks_per_chunk}`. */
export function chunkKeyOf(g: KvChunkGeometry): string {
  return g.nchunk === 1 ? "c1" : `c${g.nchunk}x${g.blocks_per_chunk}`;
}
