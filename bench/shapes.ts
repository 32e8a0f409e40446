/**
 * The benchmark's shapes and batches: decode, causal prefill and mixed shapes (big for real GPUs,
 * small for software adapters), the work each does (K+V bytes read, flops), and a float16
 * batch with a random permuted block table and random cache bytes in the shape's cache dtype
 * (f16, bf16 or fp8 e4m3). Big caches (GiBs) are filled by repeating 1 MiB of random values.
 * @module
 */
import { encode, resolveStorage } from "../core/dtype.ts";
import { plainLayer } from "../core/layer.ts";
import type {
  ForwardBatch,
  KvCacheDType,
  KvCacheSpec,
  SelectorConfig,
  StorageDType,
} from "../core/types.ts";

/** `reqs` requests of `qlen` new tokens each, at seq_len `ctx` (so `ctx - qlen` cached). */
export interface BenchPart {
  reqs: number;
  ctx: number;
  qlen: number;
}

/** One benchmark shape. */
export interface BenchShape {
  /**
   * `mixed`: one call of `reqs` decode rows (`qlen` 1) then the `chunks` requests (prefill
   * chunks over a cached prefix); WEBGPU_FLASH splits it by row (decode rows on the split-KV
   * kernels, the chunks on the prefill path) in one submit.
   */
  kind: "decode" | "prefill" | "mixed";
  reqs: number;
  /** seq_len of every request (of a mixed shape: of its decode rows). */
  ctx: number;
  /** New tokens per request (1 for decode, ctx for a full prefill). */
  qlen: number;
  /** A mixed shape's requests after the decode rows. */
  chunks?: BenchPart;
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
  block_size: number;
  /** The cache's dtype (the data is float16). */
  kv_cache_dtype: KvCacheDType;
  /** The cache layout (default NHD). */
  layout?: "NHD" | "HND";
}

const CACHE_BYTES: Record<string, number> = {
  auto: 2,
  float16: 2,
  bfloat16: 2,
  fp8: 1,
  fp8_e4m3: 1,
};

/** The requests of `s`, in batch order: `{reqs, ctx, qlen}`, then a mixed shape's chunks. */
export function shapeParts(s: BenchShape): BenchPart[] {
  const first = { reqs: s.reqs, ctx: s.ctx, qlen: s.qlen };
  return s.chunks ? [first, { ...s.chunks }] : [first];
}

/**
 * A readable name for a shape, e.g. `decode 32x2048 32q/8kv d128 bs16 f16`, `prefill 4x1024
 * causal ...`, `mixed 32x2048 + 2x512/1536 ...` (32 decode rows at seq_len 2048, then 2 chunks of
 * 512 new tokens over 1536 cached); `--shapes` regexes match these.
 */
export function shapeName(s: BenchShape): string {
  const kv = s.kv_cache_dtype === "auto" ? "f16" : `f16 data, ${s.kv_cache_dtype} cache`;
  const c = s.chunks;
  const what = s.kind === "mixed" && c
    ? `${s.reqs}x${s.ctx} + ${c.reqs}x${c.qlen}/${c.ctx - c.qlen}`
    : `${s.reqs}x${s.ctx}${s.kind === "prefill" ? " causal" : ""}`;
  return `${s.kind} ${what} ` +
    `${s.num_heads}q/${s.num_kv_heads}kv d${s.head_size} bs${s.block_size} ${kv}` +
    (s.layout === "HND" ? " HND" : "");
}

/**
 * Shapes: on GPUs decode 32 x 2048 and 64 x 8192 (f16 cache, then bf16 and fp8 e4m3 caches at
 * 32 x 2048), prefill 4 x 1024 and 8 x 4096 causal, and a mixed batch (32 decode rows at 2048,
 * then 2 chunks of 512 new tokens over 1536 cached), 32 q / 8 kv heads; on software adapters
 * decode 16 x 1024 (f16, bf16, fp8), prefill 2 x 256 and mixed 16 x 1024 + 2 chunks of 128 over
 * 384 cached, 16 q / 4 kv heads. With `hnd`, the f16 decode shapes again over an HND cache (each
 * kv head's block rows contiguous: whether the NHD rows' 2 KB stride costs bandwidth), after the
 * NHD ones. With `prefillCaches`, the prefill shapes again over each of those cache dtypes (a
 * prefill that reads half the bytes, or decodes more per byte: what binds its rows), after the
 * f16 ones; with `prefillGroups`, the (f16) prefill shapes again with each GQA group size (query
 * heads = kv heads x group: 8 is Llama 3 70B's 64 q / 8 kv), after those.
 */
export function benchShapes(
  small: boolean,
  hnd = false,
  prefillCaches: readonly KvCacheDType[] = [],
  prefillGroups: readonly number[] = [],
): BenchShape[] {
  const all = nhdShapes(small);
  const f16 = all.filter((s) => s.kind === "decode" && s.kv_cache_dtype === "auto");
  const alt = hnd ? f16.map((s) => ({ ...s, layout: "HND" as const })) : [];
  const at = all.findIndex((s) => s.kind === "prefill");
  const pre = all.filter((s) => s.kind === "prefill");
  const more = [
    ...prefillCaches.flatMap((kv) => pre.map((s) => ({ ...s, kv_cache_dtype: kv }))),
    ...prefillGroups.flatMap((g) =>
      pre.filter((s) => s.num_heads !== s.num_kv_heads * g) // not the shapes' own group again
        .map((s) => ({ ...s, num_heads: s.num_kv_heads * g }))
    ),
  ];
  const end = at + pre.length;
  return [...all.slice(0, at), ...alt, ...all.slice(at, end), ...more, ...all.slice(end)];
}

function nhdShapes(small: boolean): BenchShape[] {
  const h = small ? { num_heads: 16, num_kv_heads: 4 } : { num_heads: 32, num_kv_heads: 8 };
  const base = { ...h, head_size: 128, block_size: 16, kv_cache_dtype: "auto" as KvCacheDType };
  const dec = (reqs: number, ctx: number, kv: KvCacheDType = "auto"): BenchShape => ({
    ...base,
    kind: "decode",
    reqs,
    ctx,
    qlen: 1,
    kv_cache_dtype: kv,
  });
  const pre = (reqs: number, ctx: number): BenchShape => ({
    ...base,
    kind: "prefill",
    reqs,
    ctx,
    qlen: ctx,
  });
  // Decode rows, then prefill chunks of `qlen` new tokens over `cached` ones.
  const mixed = (reqs: number, ctx: number, chunks: number, qlen: number, cached: number) => ({
    ...dec(reqs, ctx),
    kind: "mixed" as const,
    chunks: { reqs: chunks, ctx: cached + qlen, qlen },
  });
  if (small) {
    return [
      dec(16, 1024),
      dec(16, 1024, "bfloat16"),
      dec(16, 1024, "fp8_e4m3"),
      pre(2, 256),
      mixed(16, 1024, 2, 128, 384),
    ];
  }
  return [
    dec(32, 2048),
    dec(64, 8192),
    dec(32, 2048, "bfloat16"),
    dec(32, 2048, "fp8_e4m3"),
    pre(4, 1024),
    pre(8, 4096),
    mixed(32, 2048, 2, 512, 1536),
  ];
}

/**
 * Bytes of K+V the requests read (each request's seq_len once, cache dtype) and flops of their
 * causal attention (4·S·H·D per query token over S keys: 4·T·S·H·D/2 for a full prefill), over
 * every part of the shape.
 */
export function work(s: BenchShape): { kv_bytes: number; flops: number } {
  let kv_bytes = 0, flops = 0;
  for (const p of shapeParts(s)) {
    kv_bytes += p.reqs * p.ctx * s.num_kv_heads * s.head_size * 2 * CACHE_BYTES[s.kv_cache_dtype];
    let per = 0;
    for (let j = 0; j < p.qlen; j++) {
      per += 4 * (p.ctx - p.qlen + j + 1) * s.num_heads * s.head_size;
    }
    flops += per * p.reqs;
  }
  return { kv_bytes, flops };
}

/** A mixed shape's decode rows and its chunks as shapes of their own (for their work). */
export function mixedParts(s: BenchShape): { decode: BenchShape; prefill: BenchShape } | null {
  if (s.kind !== "mixed" || !s.chunks) return null;
  const { chunks, ...rest } = s;
  return {
    decode: { ...rest, kind: "decode" },
    prefill: { ...rest, kind: "prefill", ...chunks },
  };
}

/** `n` bytes: 1 MiB of `gen()` bytes, repeated. */
function repeated(n: number, gen: (bytes: number) => Uint8Array): Uint8Array {
  const unit = gen(Math.min(n, 1 << 20));
  const out = new Uint8Array(n);
  out.set(unit.subarray(0, Math.min(n, unit.length)));
  for (let have = unit.length; have < n; have *= 2) {
    out.copyWithin(have, 0, Math.min(have, n - have));
  }
  return out;
}

/** A float16 batch of `s` with a random permuted block table and random cache bytes. */
export function makeBatch(s: BenchShape): {
  batch: Omit<ForwardBatch, "cache">;
  spec: KvCacheSpec;
  key: Uint8Array;
  value: Uint8Array;
  selector: SelectorConfig;
} {
  let x = 0x2545f491;
  const rnd = () => ((x ^= x << 13), (x ^= x >>> 17), (x ^= x << 5), (x >>> 0) / 4294967296);
  const table = Float32Array.from({ length: 4096 }, () => Math.fround(rnd() * 2 - 1));
  const { num_heads: H, num_kv_heads: Hkv, head_size: D, block_size: bs } = s;
  // One {ctx, qlen} per request, in batch order; each request's blocks are the next of a
  // random permutation of 1..num_blocks-1 (block 0 pads the shorter rows' table columns).
  const each = shapeParts(s).flatMap((p) => Array.from({ length: p.reqs }, () => p));
  const reqs = each.length;
  const blocks = each.map((p) => Math.ceil(p.ctx / bs));
  const per = Math.max(...blocks);
  const num_blocks = 1 + blocks.reduce((a, b) => a + b, 0);
  const perm = Array.from({ length: num_blocks - 1 }, (_, i) => i + 1);
  for (let i = perm.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [perm[i], perm[j]] = [perm[j], perm[i]];
  }
  const block_table = new Int32Array(reqs * per);
  const query_start_loc = new Int32Array(reqs + 1);
  for (let r = 0, next = 0; r < reqs; r++) {
    block_table.set(perm.slice(next, next + blocks[r]), r * per);
    next += blocks[r];
    query_start_loc[r + 1] = query_start_loc[r] + each[r].qlen;
  }
  const T = query_start_loc[reqs];
  const qlen = Math.max(...each.map((p) => p.qlen));
  const slot_mapping = new Int32Array(T);
  for (let r = 0; r < reqs; r++) {
    const { ctx, qlen: n } = each[r];
    for (let j = 0; j < n; j++) {
      const p = ctx - n + j;
      slot_mapping[query_start_loc[r] + j] = block_table[r * per + Math.floor(p / bs)] * bs +
        (p % bs);
    }
  }
  const storage: StorageDType = resolveStorage(s.kv_cache_dtype, "float16");
  const eb = CACHE_BYTES[s.kv_cache_dtype];
  const cacheBytes = (bytes: number) =>
    encode(storage, Float32Array.from({ length: bytes / eb }, () => table[(rnd() * 4096) | 0]));
  const vals = (n: number) => {
    const bytes = repeated(4 * n, (b) => {
      const v = Float32Array.from({ length: b / 4 }, () => table[(rnd() * 4096) | 0]);
      return new Uint8Array(v.buffer);
    });
    return new Float32Array(bytes.buffer);
  };
  const n = num_blocks * bs * Hkv * D * eb;
  const spec: KvCacheSpec = {
    num_blocks,
    block_size: bs,
    num_kv_heads: Hkv,
    head_size: D,
    dtype: "float16",
    kv_cache_dtype: s.kv_cache_dtype === "auto" ? "float16" : s.kv_cache_dtype,
    layout: s.layout ?? "NHD",
  };
  const selector: SelectorConfig = {
    head_size: D,
    dtype: "float16",
    kv_cache_dtype: s.kv_cache_dtype,
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
    kv_cache_layout: s.layout ?? "NHD",
    max_query_len: qlen,
  };
  const batch: Omit<ForwardBatch, "cache"> = {
    dtype: "float16",
    layer: plainLayer({ num_heads: H, num_kv_heads: Hkv, head_size: D }),
    num_tokens: T,
    query: vals(T * H * D),
    key: vals(T * Hkv * D),
    value: vals(T * Hkv * D),
    metadata: {
      num_reqs: reqs,
      query_start_loc,
      seq_lens: Int32Array.from(each, (p) => p.ctx),
      block_table,
      max_blocks_per_req: per,
      slot_mapping,
    },
    return_lse: false,
  };
  return { batch, spec, key: repeated(n, cacheBytes), value: repeated(n, cacheBytes), selector };
}
