/**
 * A deliberately naive float64 attention, written from the contract (docs/api.md) alone,
 * to cross-check CPU_REFERENCE. No blocking, no online softmax, no shared code with the
 * backends except the byte encodings of core/dtype.ts: one loop nest per (request, query,
 * head) that gathers every visible key through the block table, scores it, applies the
 * soft cap, ALiBi and the mask, and takes a two-pass softmax with the sink in the
 * denominator.
 * @module
 */
import { decode, roundTo } from "../../core/dtype.ts";
import type { ForwardBatch, KvCacheSpec, StorageDType } from "../../core/types.ts";

/** What the naive reference computes. */
export interface NaiveResult {
  /** [num_tokens, num_heads, head_size], rounded to the batch dtype. */
  output: Float64Array;
  /** [num_heads, num_tokens]: log of the softmax denominator (sink included). */
  lse: Float64Array;
  /** The caches after the write, as stored values (layout order); empty without a cache. */
  key_cache: Float64Array;
  value_cache: Float64Array;
}

/**
 * Runs the contract on a host batch. `cache` holds the initial bytes and spec (null for
 * encoder / encoder_only); it is not modified.
 */
export function naiveAttention(
  batch: Omit<ForwardBatch, "cache">,
  cache: { spec: KvCacheSpec; key: Uint8Array; value: Uint8Array } | null,
): NaiveResult {
  const L = batch.layer;
  const H = L.num_heads, Hkv = L.num_kv_heads, D = L.head_size;
  const T = batch.num_tokens;
  const md = batch.metadata;
  const group = H / Hkv;
  const output = new Float64Array(T * H * D);
  const lse = new Float64Array(H * T);

  // 1. The cache, decoded to numbers, and the write of the new K/V.
  let kc = new Float64Array(0), vc = new Float64Array(0);
  let storage: StorageDType = "float32";
  let fp8 = false;
  if (cache) {
    const s = cache.spec;
    // vLLM's names: auto is the data dtype, fp8 is e4m3.
    storage = s.kv_cache_dtype === "auto"
      ? batch.dtype
      : s.kv_cache_dtype === "fp8"
      ? "fp8_e4m3"
      : s.kv_cache_dtype;
    fp8 = storage === "fp8_e4m3" || storage === "fp8_e5m2";
    kc = Float64Array.from(decode(storage, cache.key));
    vc = Float64Array.from(decode(storage, cache.value));
    for (let t = 0; t < md.slot_mapping.length; t++) {
      const slot = md.slot_mapping[t];
      if (slot === -1) continue;
      const block = Math.floor(slot / s.block_size), off = slot % s.block_size;
      for (let h = 0; h < Hkv; h++) {
        for (let d = 0; d < D; d++) {
          const at = cacheElement(s, block, off, h, d);
          const k = batch.key![(t * Hkv + h) * D + d];
          const v = batch.value![(t * Hkv + h) * D + d];
          kc[at] = roundTo(storage, fp8 ? k / L.k_scale : k);
          vc[at] = roundTo(storage, fp8 ? v / L.v_scale : v);
        }
      }
    }
  }
  const kScale = fp8 ? L.k_scale : 1, vScale = fp8 ? L.v_scale : 1;
  const fromCall = L.attn_type === "encoder" || L.attn_type === "encoder_only";

  // 2. Attention, one (request, query, head) at a time.
  for (let i = 0; i < md.num_reqs; i++) {
    const q0 = md.query_start_loc[i], qlen = md.query_start_loc[i + 1] - q0;
    const S = md.seq_lens[i];
    // The keys of this request: position k -> its K and V vectors (real values).
    const keyVec = (k: number, kvh: number, which: "k" | "v"): number[] => {
      const out: number[] = [];
      if (fromCall) {
        const src = which === "k" ? batch.key! : batch.value!;
        for (let d = 0; d < D; d++) out.push(src[((q0 + k) * Hkv + kvh) * D + d]);
        return out;
      }
      const s = cache!.spec;
      const block = md.block_table[i * md.max_blocks_per_req + Math.floor(k / s.block_size)];
      const src = which === "k" ? kc : vc;
      const sc = which === "k" ? kScale : vScale;
      for (let d = 0; d < D; d++) {
        out.push(src[cacheElement(s, block, k % s.block_size, kvh, d)] * sc);
      }
      return out;
    };
    for (let j = 0; j < qlen; j++) {
      const t = q0 + j;
      const p = S - qlen + j; // the query's position
      for (let h = 0; h < H; h++) {
        const kvh = Math.floor(h / group);
        const q: number[] = [];
        for (let d = 0; d < D; d++) q.push(batch.query[(t * H + h) * D + d]);
        const scores: number[] = [];
        const values: number[][] = [];
        for (let k = 0; k < S; k++) {
          if (L.causal && k > p) continue;
          // The window: p - k < w; without causality both sides, |p - k| < w (docs/api.md).
          const dk = L.causal ? p - k : Math.abs(p - k);
          if (L.sliding_window !== null && !(dk < L.sliding_window)) continue;
          const kv = keyVec(k, kvh, "k");
          let s = 0;
          for (let d = 0; d < D; d++) s += q[d] * kv[d];
          s *= L.scale;
          if (L.logits_soft_cap !== null) s = L.logits_soft_cap * Math.tanh(s / L.logits_soft_cap);
          if (L.alibi_slopes !== null) s += -L.alibi_slopes[h] * (p - k);
          scores.push(s);
          values.push(keyVec(k, kvh, "v"));
        }
        const sink = L.sinks !== null ? L.sinks[h] : -Infinity;
        const m = Math.max(sink, ...scores);
        let denom = Math.exp(sink - m);
        for (const s of scores) denom += Math.exp(s - m);
        for (let d = 0; d < D; d++) {
          let acc = 0;
          for (let n = 0; n < scores.length; n++) acc += Math.exp(scores[n] - m) * values[n][d];
          output[(t * H + h) * D + d] = roundTo(batch.dtype, acc / denom);
        }
        lse[h * T + t] = m + Math.log(denom);
      }
    }
  }
  return { output, lse, key_cache: kc, value_cache: vc };
}

function cacheElement(s: KvCacheSpec, block: number, off: number, h: number, d: number): number {
  return s.layout === "NHD"
    ? (((block * s.block_size + off) * s.num_kv_heads + h) * s.head_size) + d
    : (((block * s.num_kv_heads + h) * s.block_size + off) * s.head_size) + d;
}
