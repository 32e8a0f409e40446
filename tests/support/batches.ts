/**
 * Random forward batches for tests: from a {@link BatchSpec} (dtypes, layout, shapes, layer
 * options and per-request `(query_len, seq_len)`), {@link generateBatch} draws fresh random
 * data from a seeded PRNG and builds a host {@link ForwardBatch} (minus its cache), the
 * initial cache bytes every backend imports, and the selector config a forward call would
 * produce (mirroring service/forward.ts).
 *
 * The cache is hostile on purpose: block 0 is a null block no request uses (block_table
 * columns past a request's need point at it), every slot that no request may read or that
 * this call must write first is NaN, and the block table is a random permutation. New tokens
 * listed as padding get slot -1: their cache slot keeps its old (finite, stale) contents,
 * which attention then reads.
 * @module
 */
import { encode, resolveStorage, roundArray } from "../../core/dtype.ts";
import type {
  AttnType,
  DType,
  ForwardBatch,
  KvCacheDType,
  KvCacheSpec,
  KvLayout,
  SelectorConfig,
  StorageDType,
} from "../../core/types.ts";
import { Rng } from "./rng.ts";

export { deriveSeed, Rng } from "./rng.ts";

/** One request of a batch. */
export interface RequestSpec {
  /** New (query) tokens of the request. */
  query_len: number;
  /** Tokens after this step: context + new (for encoder_decoder: the encoder's length). */
  seq_len: number;
  /** How many of its written key rows get slot -1 (chosen at random). */
  pad?: number;
}

/** Everything that defines a test batch except the random data. */
export interface BatchSpec {
  dtype: DType;
  kv_cache_dtype: KvCacheDType;
  layout: KvLayout;
  block_size: number;
  head_size: number;
  num_heads: number;
  num_kv_heads: number;
  requests: RequestSpec[];
  attn_type?: AttnType;
  /** Default: attn_type === "decoder". */
  causal?: boolean;
  sliding_window?: number | null;
  logits_soft_cap?: number | null;
  alibi?: boolean;
  sinks?: boolean;
  return_lse?: boolean;
  k_scale?: number;
  v_scale?: number;
  scale?: number;
  /** encoder_decoder only: the call carries the encoder K/V and writes them (default true). */
  cross_write?: boolean;
  /** Spare free blocks beyond what the requests need (default 2). */
  spare_blocks?: number;
  /** Standard deviation of the query values (default 1). */
  q_std?: number;
  /** The slots nothing reads start as a large finite value (1e4: the fp8 kinds saturate) instead
   * of NaN, so an fp8 e4m3 cache holds no NaN byte (gpu/kv_cache.ts `fp8_nan_free`). */
  finite_fill?: boolean;
}

/** A generated batch: host tensors, initial cache bytes and bookkeeping for checks. */
export interface GeneratedBatch {
  spec: BatchSpec;
  seed: number;
  batch: Omit<ForwardBatch, "cache">;
  /** null for encoder / encoder_only. */
  cache_spec: KvCacheSpec | null;
  storage: StorageDType | null;
  /** Initial cache contents (layout order, storage dtype bytes). */
  key_cache: Uint8Array;
  value_cache: Uint8Array;
  /** Slots (block * block_size + offset) this call writes. */
  written_slots: Int32Array;
  /** Slots of the positions whose key rows are padding (slot -1): they must keep old data. */
  padding_slots: Int32Array;
  selector: SelectorConfig;
  /** Shapes for reports. */
  output_shape: number[];
  cache_shape: number[];
}

/** Element offset of (block, offset-in-block, kv head, 0) in a cache of this layout. */
export function cacheIndex(
  layout: KvLayout,
  block_size: number,
  num_kv_heads: number,
  head_size: number,
  block: number,
  offset: number,
  head: number,
): number {
  return layout === "NHD"
    ? ((block * block_size + offset) * num_kv_heads + head) * head_size
    : ((block * num_kv_heads + head) * block_size + offset) * head_size;
}

/** ALiBi slopes as in the ALiBi paper (and vLLM's tests): 2^(-8(h+1)/H) for H a power of two. */
export function alibiSlopes(num_heads: number): Float32Array {
  return Float32Array.from({ length: num_heads }, (_, h) => 2 ** (-8 * (h + 1) / num_heads));
}

const isEncoder = (t: AttnType) => t === "encoder" || t === "encoder_only";

function randn(rng: Rng, n: number, std: number): Float32Array {
  const a = new Float32Array(n);
  rng.fillNormal(a, 0, n, std);
  return a;
}

/**
 * A small f16 decoder batch (NHD, block 16, head 64, 4 q / 2 kv heads, a decode row beside a
 * 5-token prefill, with LSE) with `o`'s fields instead.
 */
export function smallSpec(o: Partial<BatchSpec> = {}): BatchSpec {
  return {
    dtype: "float16",
    kv_cache_dtype: "auto",
    layout: "NHD",
    block_size: 16,
    head_size: 64,
    num_heads: 4,
    num_kv_heads: 2,
    requests: [{ query_len: 1, seq_len: 30 }, { query_len: 5, seq_len: 12 }],
    return_lse: true,
    ...o,
  };
}

/** Builds a batch with fresh random data from `seed`. */
export function generateBatch(spec: BatchSpec, seed: number): GeneratedBatch {
  const rng = new Rng(seed);
  const attn_type = spec.attn_type ?? "decoder";
  const causal = spec.causal ?? attn_type === "decoder";
  const cross = attn_type === "encoder_decoder";
  const usesCache = !isEncoder(attn_type);
  const { num_heads: H, num_kv_heads: Hkv, head_size: D, block_size: bs } = spec;
  const R = spec.requests.length;
  const qsl = new Int32Array(R + 1);
  const seq_lens = new Int32Array(R);
  spec.requests.forEach((r, i) => {
    if (isEncoder(attn_type) && r.seq_len !== r.query_len) {
      throw new Error(`request ${i}: ${attn_type} needs seq_len == query_len`);
    }
    if (attn_type === "decoder" && r.seq_len < r.query_len) {
      throw new Error(`request ${i}: seq_len ${r.seq_len} < query_len ${r.query_len}`);
    }
    qsl[i + 1] = qsl[i] + r.query_len;
    seq_lens[i] = r.seq_len;
  });
  const T = qsl[R];
  const cross_write = cross && (spec.cross_write ?? true);
  // Key rows of this call: per request, the new positions (decoder), all encoder positions
  // (encoder_decoder writing), or the request's own tokens (encoder types).
  const keyRows: { req: number; pos: number }[] = [];
  spec.requests.forEach((r, i) => {
    if (cross) {
      if (cross_write) { for (let p = 0; p < r.seq_len; p++) keyRows.push({ req: i, pos: p }); }
    } else {
      for (let j = 0; j < r.query_len; j++) {
        keyRows.push({ req: i, pos: r.seq_len - r.query_len + j });
      }
    }
  });
  const Tk = keyRows.length;

  const dtype = spec.dtype;
  const query = roundArray(dtype, randn(rng, T * H * D, spec.q_std ?? 1));
  const hasKey = !cross || cross_write;
  const key = hasKey ? roundArray(dtype, randn(rng, Tk * Hkv * D, 1)) : null;
  const value = hasKey ? roundArray(dtype, randn(rng, Tk * Hkv * D, 1)) : null;

  const k_scale = spec.k_scale ?? 1, v_scale = spec.v_scale ?? 1;
  // Only fp8 storage is scaled (real = stored * scale).
  const isFp8 = ["fp8", "fp8_e4m3", "fp8_e5m2"].includes(spec.kv_cache_dtype);
  const ks = isFp8 ? k_scale : 1, vs = isFp8 ? v_scale : 1;
  let cache_spec: KvCacheSpec | null = null;
  let storage: StorageDType | null = null;
  let key_cache: Uint8Array = new Uint8Array(0), value_cache: Uint8Array = new Uint8Array(0);
  let block_table: Int32Array = new Int32Array(0);
  let maxBlocks = 0;
  const slot_mapping = new Int32Array(Tk).fill(-1);
  const written: number[] = [];
  const paddingSlots: number[] = [];
  if (usesCache) {
    storage = resolveStorage(spec.kv_cache_dtype, dtype);
    const need = spec.requests.map((r) => Math.ceil(r.seq_len / bs));
    const used = need.reduce((a, b) => a + b, 0);
    const num_blocks = 1 + used + (spec.spare_blocks ?? 2);
    maxBlocks = Math.max(1, ...need) + 1; // one spare column, pointing at the null block
    const perm = rng.shuffle(Array.from({ length: num_blocks - 1 }, (_, i) => i + 1));
    block_table = new Int32Array(R * maxBlocks); // zeros: the null block
    let next = 0;
    need.forEach((n, i) => {
      for (let j = 0; j < n; j++) block_table[i * maxBlocks + j] = perm[next++];
    });
    cache_spec = {
      num_blocks,
      block_size: bs,
      num_kv_heads: Hkv,
      head_size: D,
      dtype,
      kv_cache_dtype: spec.kv_cache_dtype,
      layout: spec.layout,
    };
    const slotOf = (req: number, pos: number) =>
      block_table[req * maxBlocks + Math.floor(pos / bs)] * bs + (pos % bs);
    // Which key rows are padding.
    const padded = new Uint8Array(Tk);
    spec.requests.forEach((r, i) => {
      const rows = keyRows.map((kr, t) => ({ kr, t })).filter((x) => x.kr.req === i);
      const k = Math.min(r.pad ?? 0, rows.length);
      for (const x of rng.shuffle(rows).slice(0, k)) padded[x.t] = 1;
    });
    keyRows.forEach((kr, t) => {
      if (!padded[t]) {
        slot_mapping[t] = slotOf(kr.req, kr.pos);
        written.push(slot_mapping[t]);
      } else paddingSlots.push(slotOf(kr.req, kr.pos));
    });
    // Initial contents: NaN everywhere, then finite stale/context data where a request reads
    // a slot this call does not write.
    const n = num_blocks * bs * Hkv * D;
    const fill = spec.finite_fill ? 1e4 : NaN;
    const kv = new Float32Array(n).fill(fill), vv = new Float32Array(n).fill(fill);
    const writtenSet = new Set(written);
    spec.requests.forEach((r, i) => {
      for (let p = 0; p < r.seq_len; p++) {
        const s = slotOf(i, p);
        if (writtenSet.has(s)) continue;
        const b = Math.floor(s / bs), o = s % bs;
        for (let h = 0; h < Hkv; h++) {
          const base = cacheIndex(spec.layout, bs, Hkv, D, b, o, h);
          rng.fillNormal(kv, base, D, 1 / ks);
          rng.fillNormal(vv, base, D, 1 / vs);
        }
      }
    });
    key_cache = encode(storage, kv);
    value_cache = encode(storage, vv);
  }

  const layer = {
    num_heads: H,
    num_kv_heads: Hkv,
    head_size: D,
    scale: spec.scale ?? 1 / Math.sqrt(D),
    sliding_window: spec.sliding_window ?? null,
    logits_soft_cap: spec.logits_soft_cap ?? null,
    alibi_slopes: spec.alibi ? alibiSlopes(H) : null,
    sinks: spec.sinks ? Float32Array.from({ length: H }, () => rng.uniform(-2, 3)) : null,
    attn_type,
    causal,
    k_scale,
    v_scale,
  };
  const maxQ = spec.requests.reduce((m, r) => Math.max(m, r.query_len), 0);
  const return_lse = spec.return_lse ?? false;
  const selector: SelectorConfig = {
    head_size: D,
    dtype,
    kv_cache_dtype: usesCache ? spec.kv_cache_dtype : "auto",
    block_size: usesCache ? bs : null,
    use_mla: false,
    has_sink: layer.sinks !== null,
    use_sparse: false,
    use_mm_prefix: false,
    attn_type,
    has_sliding_window: layer.sliding_window !== null,
    // As service/forward.ts: encoder types imply non-causal; the flag is for decoder attention.
    use_non_causal: attn_type === "decoder" && !causal,
    use_batch_invariant: false,
    use_per_head_quant_scales: false,
    use_alibi: layer.alibi_slopes !== null,
    use_logits_soft_cap: layer.logits_soft_cap !== null,
    return_lse,
    max_query_len: maxQ,
  };
  if (usesCache) selector.kv_cache_layout = spec.layout;
  const cache_shape = cache_spec
    ? (spec.layout === "NHD"
      ? [cache_spec.num_blocks, bs, Hkv, D]
      : [cache_spec.num_blocks, Hkv, bs, D])
    : [];
  return {
    spec,
    seed,
    batch: {
      dtype,
      layer,
      num_tokens: T,
      query,
      key,
      value,
      metadata: {
        num_reqs: R,
        query_start_loc: qsl,
        seq_lens,
        block_table,
        max_blocks_per_req: maxBlocks,
        slot_mapping,
      },
      return_lse,
    },
    cache_spec,
    storage,
    key_cache,
    value_cache,
    written_slots: Int32Array.from(written),
    padding_slots: Int32Array.from(paddingSlots),
    selector,
    output_shape: [T, H, D],
    cache_shape,
  };
}
