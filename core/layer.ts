/**
 * A plain decoder layer (tests, benches): causal, no window, soft cap, ALiBi or sinks, scale
 * 1 / sqrt(head_size), unit fp8 scales.
 * @module
 */
import type { LayerSpec } from "./types.ts";

/** A plain causal decoder layer of the given heads and head size. */
export function plainLayer(
  dims: { num_heads: number; num_kv_heads: number; head_size: number },
): LayerSpec {
  return {
    num_heads: dims.num_heads,
    num_kv_heads: dims.num_kv_heads,
    head_size: dims.head_size,
    scale: 1 / Math.sqrt(dims.head_size),
    sliding_window: null,
    logits_soft_cap: null,
    alibi_slopes: null,
    sinks: null,
    attn_type: "decoder",
    causal: true,
    k_scale: 1,
    v_scale: 1,
  };
}
