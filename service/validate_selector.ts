/**
 * The {@link SelectorConfig} of a validated call: what backend selection is asked about, from
 * the layer, the cache spec, the held cache's storage and the batch.
 * @module
 */
import type { ForwardInput } from "../wire/codec.ts";
import type { KvCacheSpec, SelectorConfig, ValidBatch } from "../core/types.ts";
import type { HeldCacheInfo, UnattachedBatch } from "./validate_types.ts";

export function selectorOf(
  input: ForwardInput,
  layer: ValidBatch["layer"],
  spec: KvCacheSpec | null,
  held: HeldCacheInfo | null,
  batch: UnattachedBatch,
): SelectorConfig {
  const selector: SelectorConfig = {
    head_size: layer.head_size,
    dtype: input.dtype,
    kv_cache_dtype: spec?.kv_cache_dtype ?? "auto",
    block_size: spec?.block_size ?? null,
    use_mla: false,
    has_sink: layer.sinks !== null,
    use_sparse: false,
    use_mm_prefix: false,
    attn_type: layer.attn_type,
    has_sliding_window: layer.sliding_window !== null,
    // Encoder types are non-causal by definition; the flag asks for non-causal decoder attention.
    use_non_causal: layer.attn_type === "decoder" && !layer.causal,
    use_batch_invariant: false,
    use_per_head_quant_scales: false,
    use_alibi: layer.alibi_slopes !== null,
    use_logits_soft_cap: layer.logits_soft_cap !== null,
    return_lse: batch.return_lse,
    max_query_len: batch.stats.max_query_len,
  };
  if (spec) selector.kv_cache_layout = spec.layout;
  if (held) selector.cache_storage = held.storage;
  return selector;
}
