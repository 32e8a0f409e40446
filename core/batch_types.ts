/**
 * A forward call's data: the paged KV cache (its spec and its bytes), the layer's attention
 * parameters, the batch metadata, the data tensors, the float32 host batch, and the validated
 * batch (its shape, then its tensors). core/types.ts re-exports it.
 * @module
 */
import type { AttnType, CacheStorage, DType, KvCacheDType, KvLayout } from "./types.ts";

/** A paged KV cache's shape and types. `kv_cache_dtype` is resolved (never `auto`). */
export interface KvCacheSpec {
  num_blocks: number;
  block_size: number;
  num_kv_heads: number;
  head_size: number;
  dtype: DType;
  kv_cache_dtype: KvCacheDType;
  layout: KvLayout;
}

/**
 * A paged KV cache, K and V. The bytes are the storage dtype's little-endian encoding in
 * `layout` order (so a host cache, a safetensors export and a GPU buffer hold the same bytes).
 */
export interface KvCache {
  readonly spec: KvCacheSpec;
  readonly storage: CacheStorage;
  /** Bytes of K plus V. */
  readonly bytes: number;
  /** The raw contents of K and V, in layout order. */
  read(): Promise<{ key: Uint8Array; value: Uint8Array }>;
  /** Frees the memory; the cache is unusable afterwards. */
  destroy(): void;
  /** Set when the device holding it was lost: its contents are gone. */
  readonly lost?: boolean;
  /**
   * An fp8 e4m3 cache none of whose bytes encodes NaN (S.1111.111): created empty and written
   * only by the cache writer (it saturates, and its inputs were checked finite), or imported
   * from bytes that were checked. Decoders may then skip the NaN case.
   */
  readonly fp8_nan_free?: boolean;
}

/** A layer's attention parameters, resolved (defaults filled in). */
export interface LayerSpec {
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
  scale: number;
  /** null: no window. */
  sliding_window: number | null;
  /** null: no cap. */
  logits_soft_cap: number | null;
  /** [num_heads] or null. */
  alibi_slopes: Float32Array | null;
  /** [num_heads] or null. */
  sinks: Float32Array | null;
  attn_type: AttnType;
  causal: boolean;
  /** fp8 cache dequant scales (real = stored * scale); 1 unless set. */
  k_scale: number;
  v_scale: number;
}

/** vLLM's CommonAttentionMetadata, validated. */
export interface BatchMetadata {
  num_reqs: number;
  /** [num_reqs + 1] */
  query_start_loc: Int32Array;
  /** [num_reqs] */
  seq_lens: Int32Array;
  /** [num_reqs * max_blocks_per_req], row-major. */
  block_table: Int32Array;
  max_blocks_per_req: number;
  /** [num_kv_tokens] (one per key row; num_tokens unless encoder_decoder); -1 = padding. */
  slot_mapping: Int32Array;
}

/**
 * A data tensor (query / key / value / output) in its dtype: the little-endian bytes exactly as
 * the request carried them (a view, not a copy, where the wire allowed it). `bytes.byteOffset`
 * is a multiple of 4 and `bytes.byteLength` is `length` times the element size.
 */
export interface DataArray {
  readonly dtype: DType;
  /** Elements. */
  readonly length: number;
  readonly bytes: Uint8Array;
}

/**
 * A forward call in float32 host form: what the float64 reference (backends/cpu/reference.ts)
 * computes on. Data tensors are Float32Array whose values are exactly representable in
 * `dtype`. Built from a {@link ValidBatch} by `hostBatch` (core/data.ts).
 */
export interface ForwardBatch {
  dtype: DType;
  layer: LayerSpec;
  num_tokens: number;
  /** [num_tokens, num_heads, head_size] */
  query: Float32Array;
  /**
   * [num_kv_tokens, num_kv_heads, head_size] or null (encoder_decoder steps adding none).
   * num_kv_tokens equals num_tokens except for encoder_decoder, where these are the
   * encoder's tokens (and slot_mapping has one entry per key token).
   */
  key: Float32Array | null;
  value: Float32Array | null;
  metadata: BatchMetadata;
  /** The paged cache (server-held or inline); null for encoder / encoder_only. */
  cache: KvCache | null;
  return_lse: boolean;
}

/** Counts a validated batch carries, computed once by validation. */
export interface BatchStats {
  /** Longest query of the batch. */
  max_query_len: number;
  /** Longest seq_len. */
  max_seq_len: number;
  /** Requests whose query length is at or under the decode threshold (1). */
  num_decode_reqs: number;
  /** Sum over query tokens of the keys each may attend (mask-aware upper bound). */
  attended_keys: number;
}

/**
 * Everything a plan may depend on: a validated forward call without its tensors. Plans are
 * built from this alone and cached under `plan_key` (it names the shape: the layer, dtypes, token
 * and request counts, blocks per request, cache spec and LSE; the plan cache tells calls of one
 * key apart by comparing their metadata arrays by value), so every call with the same metadata,
 * such as the layers of one engine step, reuses one plan.
 */
export interface BatchShape {
  readonly dtype: DType;
  readonly layer: LayerSpec;
  readonly num_tokens: number;
  /** Rows of key/value (0 when the call carries none). */
  readonly num_kv_tokens: number;
  readonly metadata: BatchMetadata;
  /** The spec of the cache the call attends over; null for encoder types. */
  readonly cache_spec: KvCacheSpec | null;
  readonly return_lse: boolean;
  readonly stats: BatchStats;
  /** The shape's key (not the metadata's values: see above). */
  readonly plan_key: string;
  /** The attached cache is fp8 e4m3 with no NaN byte (KvCache `fp8_nan_free`; part of the key). */
  readonly cache_nan_free?: boolean;
}

declare const validBrand: unique symbol;

/**
 * One forward call that passed validation (service/validate.ts builds them, and nothing else
 * does): shapes agree with the layer, metadata is consistent, every block id and slot is in
 * range, no block repeats within a request, limits hold, and tensors are finite: checked on the
 * host, or, for a large batch, by the GPU plan itself before its cache write (gpu/finite_check.ts:
 * the write is skipped and the call becomes the same 422). Backends and the cache writer trust
 * it and do not re-check.
 */
export interface ValidBatch extends BatchShape {
  readonly [validBrand]: true;
  /** [num_tokens, num_heads, head_size] */
  readonly query: DataArray;
  /** [num_kv_tokens, num_kv_heads, head_size], or null. */
  readonly key: DataArray | null;
  readonly value: DataArray | null;
  /** The cache (server-held or inline); null for encoder types. */
  readonly cache: KvCache | null;
}
