/**
 * Validation for callers that hold a batch as host arrays rather than a request (the bench,
 * the conformance suite, library users): {@link validateHostBatch} turns a float32
 * {@link ForwardBatch} (minus its cache) into the request form and runs the one validator,
 * so these callers get a {@link ValidBatch} the same way the HTTP path does.
 * @module
 */
import { fromFloats } from "../core/data.ts";
import type {
  CacheStorage,
  ForwardBatch,
  KvCache,
  KvCacheSpec,
  ValidBatch,
} from "../core/types.ts";
import type { DataTensor } from "../wire/tensors.ts";
import {
  attachCache,
  type CallLimits,
  DEFAULT_CALL_LIMITS,
  type ForwardInput,
  type ValidatedForward,
  validateForward,
} from "./validate.ts";

/** The request form of a host batch (tensors encoded in the batch dtype). */
export function hostInput(b: Omit<ForwardBatch, "cache">, cacheId?: string): ForwardInput {
  const L = b.layer, md = b.metadata;
  const data = (a: Float32Array, rows: number, heads: number): DataTensor => ({
    dtype: b.dtype,
    shape: [rows, heads, L.head_size],
    array: fromFloats(b.dtype, a),
    encoding: "binary",
  });
  const kvRows = b.key ? b.key.length / (L.num_kv_heads * L.head_size) : 0;
  return {
    dtype: b.dtype,
    layer: {
      num_heads: L.num_heads,
      num_kv_heads: L.num_kv_heads,
      head_size: L.head_size,
      scale: L.scale,
      sliding_window: L.sliding_window,
      logits_soft_cap: L.logits_soft_cap,
      alibi_slopes: L.alibi_slopes ? Array.from(L.alibi_slopes) : null,
      sinks: L.sinks ? Array.from(L.sinks) : null,
      attn_type: L.attn_type,
      causal: L.causal,
      k_scale: L.k_scale,
      v_scale: L.v_scale,
    },
    query: data(b.query, b.num_tokens, L.num_heads),
    ...(b.key && b.value
      ? { key: data(b.key, kvRows, L.num_kv_heads), value: data(b.value, kvRows, L.num_kv_heads) }
      : {}),
    metadata: {
      query_start_loc: { shape: [md.num_reqs + 1], values: md.query_start_loc },
      seq_lens: { shape: [md.num_reqs], values: md.seq_lens },
      block_table: { shape: [md.num_reqs, md.max_blocks_per_req], values: md.block_table },
      slot_mapping: { shape: [md.slot_mapping.length], values: md.slot_mapping },
    },
    ...(cacheId !== undefined ? { kv_cache: cacheId } : {}),
    return_lse: b.return_lse,
  };
}

/**
 * Validates a host batch over a cache of `spec` (null for encoder types) in `storage`.
 * @throws the validator's 422s.
 */
export function validateHostBatch(
  b: Omit<ForwardBatch, "cache">,
  spec: KvCacheSpec | null,
  storage: CacheStorage = "webgpu",
  limits: Partial<CallLimits> = DEFAULT_CALL_LIMITS,
): ValidatedForward {
  const isEnc = b.layer.attn_type === "encoder" || b.layer.attn_type === "encoder_only";
  const input = hostInput(b, spec ? "(host batch)" : undefined);
  if (isEnc) {
    delete input.metadata.block_table;
    delete input.metadata.slot_mapping;
  }
  return validateForward(input, spec ? { spec, storage } : null, limits);
}

/** {@link validateHostBatch} with the cache attached: a ValidBatch ready for plan and run. */
export function validHostBatch(b: Omit<ForwardBatch, "cache">, cache: KvCache | null): ValidBatch {
  const v = validateHostBatch(b, cache?.spec ?? null, cache?.storage ?? "webgpu");
  return attachCache(v.batch, cache);
}
