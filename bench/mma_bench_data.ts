/**
 * Data and checks for bench/mma_bench.ts: a causal f16 prefill request built straight as f16
 * bits (a pool of 65536 normal values indexed by a xorshift stream: fast at 8 x 4096 tokens)
 * and validated as the service validates it, its FLOP count, a float64 CPU reference of a
 * few sampled (token, head) rows, and an elementwise comparison of two outputs.
 * @module
 */
import { dataArray } from "../core/data.ts";
import { f16BitsToF32, f32ToF16Bits } from "../core/dtype.ts";
import type { KvCacheSpec, ValidBatch } from "../core/types.ts";
import { GpuKvCache } from "../gpu/kv_cache.ts";
import type { MmaContext } from "../gpu/flash_mma_device.ts";
import { attachCache, type ForwardInput, validateForward } from "../service/validate.ts";

/**
 * A prefill case: `reqs` requests of `len` new tokens each, no context before them; causal
 * unless `causal` is false (every token then sees all `len` keys of its request: the v0.7
 * ladder's problem, 256 key tiles for every workgroup at len 4096).
 */
export interface PrefillCase {
  causal?: boolean;
  reqs: number;
  len: number;
  heads: number;
  kvHeads: number;
  headSize: number;
  blockSize: number;
  /**
   * `bfloat16`: K/V are written to a bf16 cache (rounded there; the f16 reference rows stay
   * within the check's 1e-2 tolerance) and staged to f16 tiles by the kernel; else f16 (`auto`).
   */
  cache?: "auto" | "bfloat16";
}

/** The validated batch (new K/V written by the call), its host tensors and FLOP count. */
export interface PrefillData {
  c: PrefillCase;
  batch: ValidBatch;
  cache: GpuKvCache;
  query: Uint16Array;
  key: Uint16Array;
  value: Uint16Array;
  flops: number;
}

/** f32 value of every f16 bit pattern. */
export const F16 = Float32Array.from({ length: 65536 }, (_, h) => f16BitsToF32(h));

function normalF16(n: number, seed: number): Uint16Array {
  const pool = new Uint16Array(65536), a = new Uint16Array(n);
  let s = seed >>> 0 || 1;
  const step = () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return s >>> 0;
  };
  for (let i = 0; i < 65536; i++) {
    const u = (step() + 1) / 4294967297, v = step() / 4294967296;
    pool[i] = f32ToF16Bits(Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v));
  }
  for (let i = 0; i < n; i++) a[i] = pool[step() & 0xffff];
  return a;
}

const tensor = (bits: Uint16Array, shape: number[]) => ({
  dtype: "float16" as const,
  shape,
  array: dataArray("float16", new Uint8Array(bits.buffer)),
  encoding: "binary" as const,
});

/**
 * A `--cases` name as a case: `{reqs}x{len}`, `n` after it for non-causal, `-h{heads}k{kv}`
 * for other head counts than `base`'s (whose head size and block size it keeps), `-bf16`
 * for a bf16 cache (the staging's cost), e.g. `8x4096`, `4x1024-bf16`,
 * `4x4096n` (the v0.7 ladder's per-workgroup problem), `2x1056n-h16k4` (264 workgroups of 66
 * key tiles: with `1x...` and `3x...` a residency probe by timing). Null when it is not one.
 */
export function parseCase(name: string, base: PrefillCase): PrefillCase | null {
  const m = /^(\d+)x(\d+)(n?)(?:-h(\d+)k(\d+))?(-bf16)?$/.exec(name);
  if (!m) return null;
  const c: PrefillCase = { ...base, reqs: +m[1], len: +m[2], causal: m[3] !== "n" };
  if (m[4]) [c.heads, c.kvHeads] = [+m[4], +m[5]];
  if (m[6]) c.cache = "bfloat16";
  const ok = c.reqs > 0 && c.len > 0 && c.kvHeads > 0 && c.heads % c.kvHeads === 0;
  return ok ? c : null;
}

/** Builds and validates an f16 prefill over an empty NHD cache (blocks permuted). */
export async function prefillData(ctx: MmaContext, c: PrefillCase, seed = 1): Promise<PrefillData> {
  const { reqs, len, heads: H, kvHeads: Hkv, headSize: D, blockSize: bs } = c;
  const T = reqs * len, per = Math.ceil(len / bs), numBlocks = 1 + reqs * per;
  const perm = Array.from({ length: numBlocks - 1 }, (_, i) => i + 1);
  for (let i = perm.length - 1; i > 0; i--) {
    const j = (Math.imul(i + seed, 2654435761) >>> 0) % (i + 1);
    [perm[i], perm[j]] = [perm[j], perm[i]];
  }
  const bt = Int32Array.from(perm);
  const slots = Int32Array.from({ length: T }, (_, t) => {
    const r = Math.floor(t / len), p = t % len;
    return bt[r * per + Math.floor(p / bs)] * bs + (p % bs);
  });
  const query = normalF16(T * H * D, 3 * seed + 1);
  const key = normalF16(T * Hkv * D, 3 * seed + 2), value = normalF16(T * Hkv * D, 3 * seed + 3);
  const spec: KvCacheSpec = {
    num_blocks: numBlocks,
    block_size: bs,
    num_kv_heads: Hkv,
    head_size: D,
    dtype: "float16",
    kv_cache_dtype: c.cache ?? "auto",
    layout: "NHD",
  };
  const input: ForwardInput = {
    dtype: "float16",
    layer: {
      num_heads: H,
      num_kv_heads: Hkv,
      head_size: D,
      attn_type: "decoder",
      causal: c.causal !== false,
    },
    query: tensor(query, [T, H, D]),
    key: tensor(key, [T, Hkv, D]),
    value: tensor(value, [T, Hkv, D]),
    metadata: {
      query_start_loc: {
        shape: [reqs + 1],
        values: Int32Array.from({ length: reqs + 1 }, (_, i) => i * len),
      },
      seq_lens: { shape: [reqs], values: new Int32Array(reqs).fill(len) },
      block_table: { shape: [reqs, per], values: bt },
      slot_mapping: { shape: [T], values: slots },
    },
    kv_cache: "bench",
    return_lse: true,
  };
  const v = validateForward(input, { spec, storage: "webgpu" });
  const cache = await GpuKvCache.create(ctx, spec);
  const pairs = c.causal === false ? len * len : len * (len + 1) / 2; // (query, visible key)
  const flops = 4 * reqs * pairs * H * D;
  return { c, batch: attachCache(v.batch, cache), cache, query, key, value, flops };
}

/**
 * Float64 attention of one (token, head) row: output and lse. `source(t, kv)` (bench/mma_diag.ts)
 * names the token whose K (`kv` "k") or V ("v") stands at key position `t`; by default `t`'s own.
 */
export function referenceRow(
  p: PrefillData,
  tok: number,
  h: number,
  source: (t: number, kv: "k" | "v") => number = (t) => t,
) {
  const { len, heads: H, kvHeads: Hkv, headSize: D } = p.c;
  const t0 = tok - (tok % len), kvh = Math.floor(h / (H / Hkv));
  const q = Array.from({ length: D }, (_, d) => F16[p.query[(tok * H + h) * D + d]]);
  const s: number[] = [];
  const last = p.c.causal === false ? t0 + len - 1 : tok;
  for (let t = t0; t <= last; t++) {
    let dot = 0;
    const at = (source(t, "k") * Hkv + kvh) * D;
    for (let d = 0; d < D; d++) dot += q[d] * F16[p.key[at + d]];
    s.push(dot / Math.sqrt(D));
  }
  const m = Math.max(...s);
  let l = 0;
  const out = new Float64Array(D);
  s.forEach((x, i) => {
    const e = Math.exp(x - m), at = (source(t0 + i, "v") * Hkv + kvh) * D;
    l += e;
    for (let d = 0; d < D; d++) out[d] += e * F16[p.value[at + d]];
  });
  return { out: out.map((x) => x / l), lse: m + Math.log(l) };
}

/** Worst |a - e| / (1e-2 + 1e-2 |e|) of `want.length` f16 values of `got` from `at` (NaN: Infinity). */
export function rowError(got: Uint16Array, at: number, want: ArrayLike<number>): number {
  let worst = 0;
  for (let d = 0; d < want.length; d++) {
    const a = F16[got[at + d]], e = want[d];
    worst = Math.max(
      worst,
      Number.isNaN(a) ? Infinity : Math.abs(a - e) / (1e-2 + 1e-2 * Math.abs(e)),
    );
  }
  return worst;
}

/** Worst |a - e| / (1e-2 + 1e-2 |e|) over sampled rows (over 1 fails), and the worst lse error. */
export function checkRows(p: PrefillData, out: Uint16Array, lse: Float32Array, samples: number) {
  const { heads: H, headSize: D } = p.c, T = p.batch.num_tokens;
  let worst = 0, lseErr = 0;
  for (let i = 0; i < samples; i++) {
    const tok = (Math.imul(i + 1, 2654435761) >>> 0) % T, h = (Math.imul(i + 7, 40503) >>> 0) % H;
    const want = referenceRow(p, tok, h);
    worst = Math.max(worst, rowError(out, (tok * H + h) * D, want.out));
    lseErr = Math.max(lseErr, Math.abs(lse[h * T + tok] - want.lse));
  }
  return { worst, lseErr };
}

/** Elements of two f16 outputs apart by more than 1e-2 + 1e-2 |b|, and the largest |a - b|. */
export function compareOutputs(a: Uint16Array, b: Uint16Array) {
  let bad = 0, maxDiff = 0;
  for (let i = 0; i < a.length; i++) {
    const x = F16[a[i]], y = F16[b[i]], d = Math.abs(x - y);
    if (!(d <= 1e-2 + 1e-2 * Math.abs(y))) bad++;
    if (!(d <= maxDiff)) maxDiff = d;
  }
  return { bad, maxDiff };
}
