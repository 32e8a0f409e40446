/**
 * The benchmark's shapes and batches: a decode and a causal prefill shape (big for real
 * GPUs, small for software adapters), the work each does (K+V bytes read, flops), and a
 * float16 batch with a random permuted block table and random cache bytes.
 * @module
 */
import type { ForwardBatch, KvCacheSpec, SelectorConfig } from "../core/types.ts";

/** One benchmark shape. */
export interface BenchShape {
  kind: "decode" | "prefill";
  reqs: number;
  /** seq_len of every request. */
  ctx: number;
  /** New tokens per request (1 for decode, ctx for a full prefill). */
  qlen: number;
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
  block_size: number;
}

/** Shapes: big for real GPUs, small for software adapters. */
export function benchShapes(small: boolean): BenchShape[] {
  const h = small ? { num_heads: 16, num_kv_heads: 4 } : { num_heads: 32, num_kv_heads: 8 };
  return [
    {
      kind: "decode",
      reqs: small ? 16 : 32,
      ctx: small ? 1024 : 2048,
      qlen: 1,
      ...h,
      head_size: 128,
      block_size: 16,
    },
    {
      kind: "prefill",
      reqs: small ? 2 : 4,
      ctx: small ? 256 : 1024,
      qlen: small ? 256 : 1024,
      ...h,
      head_size: 128,
      block_size: 16,
    },
  ];
}

/** Bytes of K+V a decode reads; flops of a causal prefill (4·T·S·H·D/2 when T = S). */
export function work(s: BenchShape): { kv_bytes: number; flops: number } {
  const kv_bytes = s.reqs * s.ctx * s.num_kv_heads * s.head_size * 2 * 2; // K+V, f16
  let flops = 0;
  for (let j = 0; j < s.qlen; j++) {
    flops += 4 * (s.ctx - s.qlen + j + 1) * s.num_heads * s.head_size;
  }
  return { kv_bytes, flops: flops * s.reqs };
}

/** A float16 batch with a random permuted block table and random cache bytes. */
export function makeBatch(s: BenchShape): {
  batch: Omit<ForwardBatch, "cache">;
  spec: KvCacheSpec;
  key: Uint8Array;
  value: Uint8Array;
  selector: SelectorConfig;
} {
  let x = 0x2545f491;
  const rnd = () => ((x ^= x << 13), (x ^= x >>> 17), (x ^= x << 5), (x >>> 0) / 4294967296);
  const table = Float16Array.from({ length: 4096 }, () => rnd() * 2 - 1);
  const tbits = new Uint16Array(table.buffer);
  const { reqs, ctx, qlen, num_heads: H, num_kv_heads: Hkv, head_size: D, block_size: bs } = s;
  const per = Math.ceil(ctx / bs);
  const num_blocks = 1 + reqs * per;
  const perm = Array.from({ length: num_blocks - 1 }, (_, i) => i + 1);
  for (let i = perm.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [perm[i], perm[j]] = [perm[j], perm[i]];
  }
  const block_table = Int32Array.from(perm);
  const T = reqs * qlen;
  const slot_mapping = new Int32Array(T);
  for (let r = 0; r < reqs; r++) {
    for (let j = 0; j < qlen; j++) {
      const p = ctx - qlen + j;
      slot_mapping[r * qlen + j] = block_table[r * per + Math.floor(p / bs)] * bs + (p % bs);
    }
  }
  const fill = (n: number) => {
    const a = new Uint16Array(n);
    for (let i = 0; i < n; i++) a[i] = tbits[(rnd() * 4096) | 0];
    return new Uint8Array(a.buffer);
  };
  const vals = (n: number) => Float32Array.from({ length: n }, () => table[(rnd() * 4096) | 0]);
  const n = num_blocks * bs * Hkv * D;
  const spec: KvCacheSpec = {
    num_blocks,
    block_size: bs,
    num_kv_heads: Hkv,
    head_size: D,
    dtype: "float16",
    kv_cache_dtype: "auto",
    layout: "NHD",
  };
  const selector: SelectorConfig = {
    head_size: D,
    dtype: "float16",
    kv_cache_dtype: "auto",
    block_size: bs,
    use_mla: false,
    has_sink: false,
    use_sparse: false,
    use_mm_prefix: false,
    attn_type: "decoder",
    has_sliding_window: false,
    use_non_causal: false,
    use_batch_invariant: false,
    use_per_head_quant_scales: false,
    kv_cache_layout: "NHD",
    max_query_len: qlen,
  };
  const batch: Omit<ForwardBatch, "cache"> = {
    dtype: "float16",
    layer: {
      num_heads: H,
      num_kv_heads: Hkv,
      head_size: D,
      scale: 1 / Math.sqrt(D),
      sliding_window: null,
      logits_soft_cap: null,
      alibi_slopes: null,
      sinks: null,
      attn_type: "decoder",
      causal: true,
      k_scale: 1,
      v_scale: 1,
    },
    num_tokens: T,
    query: vals(T * H * D),
    key: vals(T * Hkv * D),
    value: vals(T * Hkv * D),
    metadata: {
      num_reqs: reqs,
      query_start_loc: Int32Array.from({ length: reqs + 1 }, (_, i) => i * qlen),
      seq_lens: new Int32Array(reqs).fill(ctx),
      block_table,
      max_blocks_per_req: per,
      slot_mapping,
    },
    return_lse: false,
  };
  return { batch, spec, key: fill(n), value: fill(n), selector };
}
