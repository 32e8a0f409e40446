/**
 * Conservative capability defaults for backend descriptors: {@link capabilities} fills every
 * field a descriptor does not name with "not supported" (empty lists, false, graph support
 * "NEVER", no batch reordering), so each descriptor states only what it does support.
 * @module
 */
import type { Capabilities } from "../core/types.ts";

/**
 * A full {@link Capabilities} record: conservative defaults overridden by `overrides`.
 * Keys keep the interface's order; every default list is a fresh array.
 */
export function capabilities(overrides: Partial<Capabilities>): Capabilities {
  return {
    dtypes: [],
    kv_cache_dtypes: [],
    block_sizes: [],
    head_sizes: [],
    kv_cache_layouts: [],
    attn_types: [],
    is_mla: false,
    sinks: false,
    sliding_window: false,
    alibi: false,
    logits_soft_cap: false,
    non_causal: false,
    sparse: false,
    mm_prefix: false,
    per_head_quant_scales: false,
    batch_invariant: false,
    kv_connector: false,
    lse: false,
    graph_support: "NEVER",
    reorder_batch_threshold: null,
    ...overrides,
  };
}
