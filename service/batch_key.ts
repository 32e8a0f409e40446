/**
 * What validation derives from a batch's metadata: its {@link BatchStats} (the attended-keys
 * count the per-call limit is checked against) and its plan key, under which the service
 * caches plans. The key names every scalar a plan depends on (the batch's shape: dtype, layer,
 * token and request counts, blocks per request, cache spec), not the metadata's values: the
 * plan cache keeps a few plans per key and tells them apart by comparing the metadata arrays
 * ({@link keyArrays}) by value, so no two batches share a plan unless their metadata is equal,
 * and nothing is hashed (a decode step's new seq_lens and slots find their key at once; hashing
 * 4k block-table words cost validation about 30 us a call).
 * @module
 */
import type { BatchMetadata, BatchStats, DType, KvCacheSpec, LayerSpec } from "../core/types.ts";

/** Keys visible to query positions `S - q .. S - 1` under a causal mask and window `w` (0: none). */
function causalKeys(q: number, S: number, w: number): number {
  const lo = S - q + 1, hi = S; // visible counts without a window: lo..hi
  if (w <= 0 || hi <= w) return (q * (lo + hi)) / 2;
  if (lo >= w) return q * w;
  return ((w - lo + 1) * (lo + w)) / 2 + (hi - w) * w;
}

/** The stats of a batch. `query_lens[i]` is request i's query length. */
export function batchStats(
  layer: LayerSpec,
  md: BatchMetadata,
  query_lens: Int32Array,
): BatchStats {
  const w = layer.sliding_window ?? 0;
  const causal = layer.causal && layer.attn_type !== "encoder_decoder";
  let max_query_len = 0, max_seq_len = 0, num_decode_reqs = 0, attended_keys = 0;
  for (let i = 0; i < md.num_reqs; i++) {
    const q = query_lens[i], S = md.seq_lens[i];
    max_query_len = Math.max(max_query_len, q);
    max_seq_len = Math.max(max_seq_len, S);
    if (q === 1) num_decode_reqs++;
    attended_keys += causal ? causalKeys(q, S, w) : q * (w > 0 ? Math.min(S, 2 * w - 1) : S);
  }
  return { max_query_len, max_seq_len, num_decode_reqs, attended_keys };
}

/**
 * The arrays a plan depends on (compared by value on a plan-cache hit), those a decode step
 * changes first and the block table, the longest and the one that changes least, last.
 */
export function keyArrays(layer: LayerSpec, md: BatchMetadata): (ArrayLike<number> | null)[] {
  const f = (a: Float32Array | null) => a ? new Int32Array(a.buffer, a.byteOffset, a.length) : null;
  return [
    md.seq_lens,
    md.slot_mapping,
    md.query_start_loc,
    f(layer.alibi_slopes),
    f(layer.sinks),
    md.block_table,
  ];
}

/** The plan key of a batch (see the module doc). */
export function planKey(p: {
  dtype: DType;
  layer: LayerSpec;
  num_tokens: number;
  num_kv_tokens: number;
  metadata: BatchMetadata;
  cache_spec: KvCacheSpec | null;
  return_lse: boolean;
}): string {
  const L = p.layer, c = p.cache_spec;
  const scalars = [
    p.dtype,
    L.attn_type,
    L.causal ? "c" : "nc",
    L.num_heads,
    L.num_kv_heads,
    L.head_size,
    L.scale,
    L.sliding_window ?? "-",
    L.logits_soft_cap ?? "-",
    L.k_scale,
    L.v_scale,
    p.num_tokens,
    p.num_kv_tokens,
    p.metadata.num_reqs,
    p.metadata.max_blocks_per_req,
    p.return_lse ? "lse" : "-",
    c ? `${c.num_blocks}x${c.block_size}:${c.kv_cache_dtype}:${c.layout}` : "nocache",
  ];
  return scalars.join("|");
}
