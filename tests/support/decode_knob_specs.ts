/**
 * What the WEBGPU_DECODE knob tests share (webgpu_decode_knobs_test.ts,
 * webgpu_decode_knobs4_test.ts): their hostile batches (rows of several slices beside rows of
 * one, an empty request, a padded block table; window, sinks, ALiBi, soft cap and LSE; fp8 /
 * bf16 / f32 caches, HND and NHD) and {@link decodePlanInfo}, the counts of what a plan runs.
 * @module
 */
import type { AttentionBackend, GpuContext } from "../../core/types.ts";
import { type DecodeTuning, DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch } from "./batches.ts";
import { freshSeed } from "../gpu/helpers.ts";

/** The plan's counts for a fresh batch of `s` under `b` (what ran: epilogue, staging, split
 * rows); the plan is disposed, nothing runs. */
export async function decodePlanInfo(
  gpu: GpuContext,
  b: AttentionBackend,
  s: BatchSpec,
): Promise<Record<string, number>> {
  const g = generateBatch(s, freshSeed());
  const cache = await GpuKvCache.fromBytes(gpu, g.cache_spec!, g.key_cache, g.value_cache);
  try {
    const plan = await b.plan(validHostBatch(g.batch, cache), { gpu });
    b.disposePlan?.(plan);
    return (plan as { info: Record<string, number> }).info;
  } finally {
    cache.destroy();
  }
}

/** The GPU kernel shape (several key groups a workgroup, on lavapipe too), one slice a row:
 * what `wg_tokens` needs (decode_wg_tokens_test.ts, decode_masked_keys_test.ts). */
export const ONE_SLICE_TUNING: DecodeTuning = {
  ...DEFAULT_DECODE_TUNING,
  workgroup_size: 128,
  keys_per_iter: 4,
  kv_heads_per_group: 1,
  waves: 0,
  target_workgroups: 64,
  min_split_keys: 4096,
};

/** Rows of several slices and of one, an empty request, a padded block table. */
export const KNOB_REQUESTS = [
  { query_len: 1, seq_len: 700 },
  { query_len: 1, seq_len: 90, pad: 1 },
  { query_len: 0, seq_len: 9 },
  { query_len: 1, seq_len: 5 },
  { query_len: 1, seq_len: 1 },
];

/** f16 data, fp8 e4m3 cache (scaled), HND, window, sinks, ALiBi, soft cap, LSE. */
export const FP8_HND_SPEC: BatchSpec = {
  dtype: "float16",
  kv_cache_dtype: "fp8_e4m3",
  k_scale: 0.5,
  v_scale: 2,
  layout: "HND",
  block_size: 16,
  head_size: 128,
  num_heads: 8,
  num_kv_heads: 2,
  requests: KNOB_REQUESTS,
  sliding_window: 300,
  sinks: true,
  alibi: true,
  logits_soft_cap: 6,
  return_lse: true,
};

/** {@link FP8_HND_SPEC}'s batch over an f16 cache, NHD, with 4 kv heads. */
export const F16_NHD_SPEC: BatchSpec = {
  ...FP8_HND_SPEC,
  kv_cache_dtype: "float16",
  k_scale: undefined,
  v_scale: undefined,
  layout: "NHD",
  num_kv_heads: 4,
};

/** bf16 data and cache, NHD, GQA 8, head 64, block 32, sinks, soft cap, LSE, 3-token rows. */
export const BF16_NHD_SPEC: BatchSpec = {
  dtype: "bfloat16",
  kv_cache_dtype: "bfloat16",
  layout: "NHD",
  block_size: 32,
  head_size: 64,
  num_heads: 16,
  num_kv_heads: 2,
  requests: [{ query_len: 1, seq_len: 1000 }, { query_len: 1, seq_len: 40 }, {
    query_len: 3,
    seq_len: 200,
    pad: 2,
  }],
  sinks: true,
  logits_soft_cap: 4,
  return_lse: true,
};

/** f32 data and cache, MHA, head 128, block 64, ALiBi, window, LSE. */
export const F32_MHA_SPEC: BatchSpec = {
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 64,
  head_size: 128,
  num_heads: 4,
  num_kv_heads: 4,
  requests: [{ query_len: 1, seq_len: 513 }, { query_len: 1, seq_len: 17 }],
  alibi: true,
  sliding_window: 400,
  return_lse: true,
};
