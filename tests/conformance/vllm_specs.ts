/**
 * vLLM's 13 attention batch specs, by their names, as `BATCH_SPECS` of vLLM's
 * tests/v1/attention/test_attention_backends.py defines them (per request `seq_lens` and
 * `query_lens`; the two `*_encoder_prefill` specs are encoder-only, non-causal attention over
 * the request's own tokens), and {@link vllmBatchSpec}, which turns one into this repo's
 * {@link BatchSpec} the way vLLM's test builds its batch: block size 16, the block table a random
 * permutation (generateBatch does that), the KV cache in the data dtype (`kv_cache_dtype` auto),
 * causal decoder attention except the encoder-only specs.
 * @module
 */
import type { BatchSpec } from "../support/batches.ts";
import type { DType } from "../../core/types.ts";

/** One of vLLM's batch specs. */
export interface VllmSpec {
  name: string;
  /** Tokens of each request after this step (context + new). */
  seq_lens: readonly number[];
  /** New tokens of each request. */
  query_lens: readonly number[];
  /** vLLM's ENCODER_ONLY specs: non-causal, no KV cache, query_len == seq_len. */
  encoder_only: boolean;
}

const rep = (n: number, times: number): number[] => Array.from({ length: times }, () => n);

/** vLLM's 13 specs, in vLLM's order. */
export const VLLM_SPECS: readonly VllmSpec[] = [
  { name: "small_decode", seq_lens: [32, 40], query_lens: [1, 1] },
  { name: "small_prefill", seq_lens: [32, 40], query_lens: [8, 8] },
  { name: "mixed_small", seq_lens: [32, 40, 48, 56], query_lens: [1, 1, 5, 5] },
  {
    name: "medium_decode",
    seq_lens: [128, 256, 512, 1024, 128, 256, 512, 1024],
    query_lens: rep(1, 8),
  },
  { name: "medium_prefill", seq_lens: [256, 512, 1024, 2048], query_lens: rep(16, 4) },
  {
    name: "mixed_medium",
    seq_lens: [512, 1024, 2048, 512, 1024, 2048],
    query_lens: [1, 1, 1, 7, 7, 7],
  },
  { name: "large_decode", seq_lens: rep(2048, 32), query_lens: rep(1, 32) },
  { name: "large_prefill", seq_lens: rep(4096, 8), query_lens: rep(32, 8) },
  {
    name: "mixed_large",
    seq_lens: [1024, 2048, 4096, 1024, 2048, 4096],
    query_lens: [1, 1, 1, 32, 32, 32],
  },
  { name: "single_decode", seq_lens: [1024], query_lens: [1] },
  { name: "single_prefill", seq_lens: [1024], query_lens: [64] },
  {
    name: "small_encoder_prefill",
    seq_lens: [32, 64, 128, 256],
    query_lens: [32, 64, 128, 256],
    encoder_only: true,
  },
  {
    name: "medium_encoder_prefill",
    seq_lens: [256, 512, 1024, 2048],
    query_lens: [256, 512, 1024, 2048],
    encoder_only: true,
  },
].map((s) => ({ encoder_only: false, ...s }));

/** The heads of the layer a spec runs with (vLLM's come from a model config). */
export interface VllmLayer {
  dtype: DType;
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
}

/** `s` as a {@link BatchSpec}: NHD, block size 16, cache in the data dtype, vLLM's lengths. */
export function vllmBatchSpec(s: VllmSpec, layer: VllmLayer): BatchSpec {
  return {
    ...layer,
    kv_cache_dtype: "auto",
    layout: "NHD",
    block_size: 16,
    requests: s.seq_lens.map((seq_len, i) => ({ seq_len, query_len: s.query_lens[i] })),
    ...(s.encoder_only ? { attn_type: "encoder_only" as const } : {}),
  };
}
