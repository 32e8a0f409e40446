/**
 * Turns a decoded forward request into a validated {@link ForwardBatch} (minus its cache)
 * and the call's {@link SelectorConfig}. Every semantic problem is collected — shapes that
 * disagree with the layer, bad batch metadata, block ids and slots out of range, duplicate
 * slots, a cache that does not fit — and thrown at once as `invalidBatch(issues)` (422).
 * @module
 */
import { roundArray } from "../core/dtype.ts";
import type { CacheTensor, DataTensor, IntTensor } from "../core/tensors.ts";
import type {
  AttnType,
  CacheStorage,
  DType,
  ForwardBatch,
  KvCacheSpec,
  KvLayout,
  SelectorConfig,
} from "../core/types.ts";
import { checkCache, checkLayer, eqShape, fmt, isEncoder, Issues } from "./forward_checks.ts";

/** A layer as the request gives it (defaults not yet applied). */
export interface LayerInput {
  num_heads: number;
  num_kv_heads: number;
  head_size: number;
  scale?: number | null;
  sliding_window?: number | null;
  logits_soft_cap?: number | null;
  alibi_slopes?: number[] | null;
  sinks?: number[] | null;
  attn_type?: AttnType;
  causal?: boolean;
  k_scale?: number;
  v_scale?: number;
}

/** A forward request with its tensors decoded (from JSON or safetensors). */
export interface ForwardInput {
  /** "auto" or absent: selection by priority; otherwise a backend name. */
  backend?: string;
  dtype: DType;
  layer: LayerInput;
  query: DataTensor;
  key?: DataTensor;
  value?: DataTensor;
  metadata: {
    query_start_loc: IntTensor;
    seq_lens: IntTensor;
    /** Optional for encoder / encoder_only (no cache). */
    block_table?: IntTensor;
    slot_mapping?: IntTensor;
  };
  /** A server-held cache id. */
  kv_cache?: string;
  key_cache?: CacheTensor;
  value_cache?: CacheTensor;
  /** Layout of the inline key_cache/value_cache (default NHD). */
  kv_cache_layout?: KvLayout;
  return_lse?: boolean;
}

/** A server-held cache as validation sees it. */
export interface HeldCacheInfo {
  spec: KvCacheSpec;
  storage: CacheStorage;
}

/** What validation produces: the batch without its cache, the selector config, inline cache bytes. */
export interface ValidatedForward {
  batch: Omit<ForwardBatch, "cache">;
  selector: SelectorConfig;
  /** The inline cache to import with the chosen backend, or null. */
  inline: { spec: KvCacheSpec; key: Uint8Array; value: Uint8Array } | null;
}

/**
 * Validates a decoded forward request. `held` is the server-held cache named by
 * `input.kv_cache` (the caller resolves the id), or null.
 * @throws ServiceError 422 `invalid_batch` listing every problem with its path and value.
 */
export function validateForward(input: ForwardInput, held: HeldCacheInfo | null): ValidatedForward {
  const is = new Issues();
  const layer = checkLayer(input, is);
  const { num_heads: H, num_kv_heads: Hkv, head_size: D } = layer;
  const q = input.query;
  if (q.shape.length !== 3 || q.shape[1] !== H || q.shape[2] !== D) {
    is.add(
      ["query", "shape"],
      `must be [num_tokens, ${H}, ${D}] (num_heads, head_size), got ${fmt(q.shape)}`,
    );
  }
  const T = q.shape[0] ?? 0;
  // key / value
  const cross = layer.attn_type === "encoder_decoder";
  let Tk = cross ? 0 : T;
  if ((input.key === undefined) !== (input.value === undefined)) {
    is.add([input.key ? "value" : "key"], "key and value come together");
  } else if (input.key && input.value) {
    const k = input.key, v = input.value;
    if (k.shape.length !== 3 || k.shape[1] !== Hkv || k.shape[2] !== D) {
      is.add(
        ["key", "shape"],
        `must be [num_kv_tokens, ${Hkv}, ${D}] (num_kv_heads, head_size), got ${fmt(k.shape)}`,
      );
    } else if (!cross && k.shape[0] !== T) {
      is.add(["key", "shape", 0], `has ${k.shape[0]} tokens but query has ${T}`);
    }
    if (!eqShape(v.shape, k.shape)) {
      is.add(["value", "shape"], `is ${fmt(v.shape)} but key is ${fmt(k.shape)}`);
    }
    if (cross) Tk = k.shape[0] ?? 0;
  } else if (!cross) {
    is.add(["key"], `attn_type ${layer.attn_type} needs key and value`);
  }
  const { spec, inline } = checkCache(input, layer, held, is);
  // metadata
  const md = input.metadata;
  const qsl = md.query_start_loc.values, sl = md.seq_lens.values;
  const mp = (k: string, ...rest: (string | number)[]) => ["metadata", k, ...rest];
  if (md.query_start_loc.shape.length !== 1 || qsl.length < 2) {
    is.add(
      mp("query_start_loc"),
      `must be 1-D with num_reqs + 1 >= 2 entries, got shape ${fmt(md.query_start_loc.shape)}`,
    );
  }
  const R = Math.max(qsl.length - 1, 0);
  const qlen = new Int32Array(R);
  let monotone = true;
  if (qsl.length > 0 && qsl[0] !== 0) is.add(mp("query_start_loc", 0), `must be 0, got ${qsl[0]}`);
  for (let i = 0; i < R; i++) {
    qlen[i] = qsl[i + 1] - qsl[i];
    if (qlen[i] < 0) {
      monotone = false;
      is.add(
        mp("query_start_loc", i + 1),
        `must be >= the previous entry ${qsl[i]}, got ${qsl[i + 1]} (non-decreasing)`,
      );
    }
  }
  if (R > 0 && qsl[R] !== T) {
    is.add(mp("query_start_loc", R), `last entry must equal num_tokens ${T}, got ${qsl[R]}`);
  }
  if (md.seq_lens.shape.length !== 1 || sl.length !== R) {
    is.add(
      mp("seq_lens"),
      `must have num_reqs = ${R} entries, got shape ${fmt(md.seq_lens.shape)}`,
    );
  } else {
    for (let i = 0; i < R; i++) {
      const s = sl[i];
      if (s < 0) is.add(mp("seq_lens", i), `must be >= 0, got ${s}`);
      else if (!monotone) continue;
      else if (isEncoder(layer.attn_type) && s !== qlen[i]) {
        is.add(
          mp("seq_lens", i),
          `must equal the query length ${qlen[i]} for ${layer.attn_type}, got ${s}`,
        );
      } else if (layer.attn_type === "decoder" && s < qlen[i]) {
        is.add(mp("seq_lens", i), `${s} is shorter than request ${i}'s query length ${qlen[i]}`);
      } else if (cross && qlen[i] > 0 && s < 1) {
        is.add(mp("seq_lens", i), `request ${i} has queries but no encoder keys (seq_len ${s})`);
      }
    }
  }
  const maxQ = qlen.reduce((m, x) => Math.max(m, x), 0);
  // block table
  let maxBlocks = 0;
  let blockTable: Int32Array = new Int32Array(0);
  if (md.block_table) {
    const bt = md.block_table;
    if (bt.shape.length === 2 && bt.shape[0] === R) maxBlocks = bt.shape[1];
    else if (bt.shape.length === 1 && R > 0 && bt.values.length % R === 0) {
      maxBlocks = bt.values.length / R;
    } else {is.add(
        mp("block_table"),
        `must be [num_reqs = ${R}, max_blocks_per_req], got shape ${fmt(bt.shape)}`,
      );}
    blockTable = bt.values;
  } else if (!isEncoder(layer.attn_type)) {
    is.add(mp("block_table"), `attn_type ${layer.attn_type} needs a block_table`);
  }
  if (spec && md.block_table && sl.length === R && blockTable.length === R * maxBlocks) {
    for (let i = 0; i < R; i++) {
      const need = Math.ceil(Math.max(sl[i], 0) / spec.block_size);
      if (need > maxBlocks) {
        is.add(
          mp("block_table", i),
          `request ${i} (seq_len ${
            sl[i]
          }) needs ${need} blocks of ${spec.block_size}, block_table has ${maxBlocks} columns`,
        );
      }
      for (let j = 0; j < Math.min(need, maxBlocks); j++) {
        const b = blockTable[i * maxBlocks + j];
        if (b < 0 || b >= spec.num_blocks) {
          is.add(mp("block_table", i, j), `block id ${b} out of range [0, ${spec.num_blocks})`);
        }
      }
    }
  }
  // slot mapping
  let slots: Int32Array = new Int32Array(Tk).fill(-1);
  if (md.slot_mapping) {
    const sm = md.slot_mapping;
    if (sm.shape.length !== 1 || sm.values.length !== Tk) {
      is.add(
        mp("slot_mapping"),
        `must have one entry per key token (${Tk}), got shape ${fmt(sm.shape)}`,
      );
    } else if (spec) {
      slots = sm.values;
      const nSlots = spec.num_blocks * spec.block_size;
      const seen = new Map<number, number>();
      for (let t = 0; t < Tk; t++) {
        const s = slots[t];
        if (s === -1) continue;
        if (s < 0 || s >= nSlots) {
          is.add(
            mp("slot_mapping", t),
            `slot ${s} out of range: -1 or [0, ${nSlots}) (num_blocks ${spec.num_blocks} x block_size ${spec.block_size})`,
          );
          continue;
        }
        const prev = seen.get(s);
        if (prev !== undefined) {
          is.add(mp("slot_mapping", t), `slot ${s} duplicates slot_mapping[${prev}]`);
        } else seen.set(s, t);
      }
    } else slots = sm.values;
  } else if (!isEncoder(layer.attn_type) && Tk > 0) {
    is.add(mp("slot_mapping"), `attn_type ${layer.attn_type} needs a slot_mapping`);
  }
  is.throwIfAny();

  const cast = (t: DataTensor | undefined) =>
    t ? (t.dtype === input.dtype ? t.values : roundArray(input.dtype, t.values)) : null;
  const batch: Omit<ForwardBatch, "cache"> = {
    dtype: input.dtype,
    layer,
    num_tokens: T,
    query: cast(input.query)!,
    key: cast(input.key),
    value: cast(input.value),
    metadata: {
      num_reqs: R,
      query_start_loc: qsl,
      seq_lens: sl,
      block_table: blockTable,
      max_blocks_per_req: maxBlocks,
      slot_mapping: slots,
    },
    return_lse: input.return_lse ?? false,
  };
  const selector: SelectorConfig = {
    head_size: D,
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
    max_query_len: maxQ,
  };
  if (spec) selector.kv_cache_layout = spec.layout;
  if (held) selector.cache_storage = held.storage;
  return { batch, selector, inline };
}
