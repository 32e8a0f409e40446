/**
 * Data and checks for bench/mma_bench.ts: a causal f16 prefill batch built straight as f16
 * bits (a pool of 65536 normal values indexed by a xorshift stream: fast at 8 x 4096 tokens),
 * its FLOP count, a float64 CPU reference for a few sampled (token, head) rows, and an
 * elementwise comparison of two outputs.
 * @module
 */
import { f16BitsToF32, f32ToF16Bits } from "../core/dtype.ts";
import type { KvCacheSpec, LayerSpec } from "../core/types.ts";
import type { MmaBatch, MmaResult } from "../gpu/flash_mma_launch.ts";

/** A prefill case: `reqs` requests of `len` new tokens each, no context before them. */
export interface PrefillCase {
  reqs: number;
  len: number;
  heads: number;
  kvHeads: number;
  headSize: number;
  blockSize: number;
}

/** The batch, its cache (already holding every key and value) and bookkeeping. */
export interface PrefillData {
  batch: MmaBatch;
  spec: KvCacheSpec;
  key: Uint16Array;
  value: Uint16Array;
  flops: number;
}

const F16 = Float32Array.from({ length: 65536 }, (_, h) => f16BitsToF32(h));

function fillNormalF16(a: Uint16Array, seed: number): void {
  const pool = new Uint16Array(65536);
  let s = seed >>> 0 || 1;
  const next = () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 4294967296;
  };
  for (let i = 0; i < 65536; i++) {
    const z = Math.sqrt(-2 * Math.log(1 - next())) * Math.cos(2 * Math.PI * next());
    pool[i] = f32ToF16Bits(z);
  }
  for (let i = 0; i < a.length; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    a[i] = pool[s & 0xffff];
  }
}

/** Builds a causal f16 prefill with NHD cache blocks in a random order. */
export function prefillData(c: PrefillCase, seed = 1): PrefillData {
  const { reqs, len, heads: H, kvHeads: Hkv, headSize: D, blockSize: bs } = c;
  const T = reqs * len, per = Math.ceil(len / bs), numBlocks = 1 + reqs * per;
  const perm = Array.from({ length: numBlocks - 1 }, (_, i) => i + 1);
  for (let i = perm.length - 1; i > 0; i--) {
    const j = (Math.imul(i + seed, 2654435761) >>> 0) % (i + 1);
    [perm[i], perm[j]] = [perm[j], perm[i]];
  }
  const query = new Uint16Array(T * H * D), key = new Uint16Array(numBlocks * bs * Hkv * D);
  const value = new Uint16Array(key.length);
  fillNormalF16(query, seed * 3 + 1);
  fillNormalF16(key, seed * 3 + 2);
  fillNormalF16(value, seed * 3 + 3);
  const layer: LayerSpec = {
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
  };
  const qsl = Int32Array.from({ length: reqs + 1 }, (_, i) => i * len);
  const batch: MmaBatch = {
    dtype: "float16",
    layer,
    num_tokens: T,
    query,
    key: null,
    value: null,
    metadata: {
      num_reqs: reqs,
      query_start_loc: qsl,
      seq_lens: new Int32Array(reqs).fill(len),
      block_table: Int32Array.from(perm),
      max_blocks_per_req: per,
      slot_mapping: new Int32Array(T).fill(-1),
    },
    return_lse: true,
  };
  const spec: KvCacheSpec = {
    num_blocks: numBlocks,
    block_size: bs,
    num_kv_heads: Hkv,
    head_size: D,
    dtype: "float16",
    kv_cache_dtype: "auto",
    layout: "NHD",
  };
  const flops = 4 * reqs * (len * (len + 1) / 2) * H * D;
  return { batch, spec, key, value, flops };
}

/** Float64 attention of one (token, head) row: output and lse. */
export function referenceRow(p: PrefillData, tok: number, h: number) {
  const b = p.batch, L = b.layer, D = L.head_size, Hkv = L.num_kv_heads, bs = p.spec.block_size;
  const len = b.metadata.seq_lens[0], req = Math.floor(tok / len), pos = tok % len;
  const kvh = Math.floor(h / (L.num_heads / Hkv)), per = b.metadata.max_blocks_per_req;
  const q = Array.from({ length: D }, (_, d) => F16[b.query[(tok * L.num_heads + h) * D + d]]);
  const s: number[] = [], rows: number[] = [];
  for (let k = 0; k <= pos; k++) {
    const block = b.metadata.block_table[req * per + Math.floor(k / bs)];
    const at = ((block * bs + (k % bs)) * Hkv + kvh) * D;
    let dot = 0;
    for (let d = 0; d < D; d++) dot += q[d] * F16[p.key[at + d]];
    s.push(dot * L.scale);
    rows.push(at);
  }
  const m = Math.max(...s);
  let l = 0;
  const out = new Float64Array(D);
  s.forEach((x, i) => {
    const e = Math.exp(x - m);
    l += e;
    for (let d = 0; d < D; d++) out[d] += e * F16[p.value[rows[i] + d]];
  });
  return { out: out.map((x) => x / l), lse: m + Math.log(l) };
}

/** Worst violation of |a - e| <= atol + rtol |e| over sampled rows (ratio > 1 fails). */
export function checkRows(p: PrefillData, r: MmaResult, samples: number, seed = 7) {
  const L = p.batch.layer, D = L.head_size, T = p.batch.num_tokens, H = L.num_heads;
  let worst = 0, lseErr = 0;
  for (let i = 0; i < samples; i++) {
    const tok = (Math.imul(i + 1, 2654435761 + seed) >>> 0) % T;
    const h = (Math.imul(i + 7, 40503) >>> 0) % H;
    const want = referenceRow(p, tok, h);
    for (let d = 0; d < D; d++) {
      const a = F16[r.output[(tok * H + h) * D + d]], e = want.out[d];
      const ratio = Math.abs(a - e) / (1e-2 + 1e-2 * Math.abs(e));
      worst = Number.isNaN(a) ? Infinity : Math.max(worst, ratio);
    }
    lseErr = Math.max(lseErr, Math.abs(r.lse[h * T + tok] - want.lse));
  }
  return { worst, lseErr };
}

/** Elementwise agreement of two f16 outputs: elements beyond atol 1e-2 + rtol 1e-2, max |diff|. */
export function compareOutputs(a: Uint16Array, b: Uint16Array) {
  let bad = 0, maxDiff = 0;
  for (let i = 0; i < a.length; i++) {
    const x = F16[a[i]], y = F16[b[i]], d = Math.abs(x - y);
    if (!(d <= 1e-2 + 1e-2 * Math.abs(y))) bad++;
    if (!(d <= maxDiff)) maxDiff = d;
  }
  return { bad, maxDiff };
}
