/**
 * Validation for callers that hold a batch as host arrays rather than a request (the bench,
 * the conformance suite, library users): {@link validateHostBatch} turns a float32
 * {@link ForwardBatch} (minus its cache) into the request form and runs the one validator,
 * so these callers get a {@link ValidBatch} the same way the HTTP path does. No schema checked
 * such a batch, so its structure is checked first (fields, types, typed-array kinds, enums,
 * counts, array lengths against the counts): every problem is an issue of the one 422
 * `invalid_batch`, whatever object is passed, never a TypeError.
 * @module
 */
import { fromFloats } from "../core/data.ts";
import {
  type CacheStorage,
  DTYPES,
  type ForwardBatch,
  type KvCache,
  type KvCacheSpec,
  type ValidBatch,
} from "../core/types.ts";
import type { DataTensor } from "../wire/tensors.ts";
import {
  attachCache,
  type CallLimits,
  DEFAULT_CALL_LIMITS,
  type ForwardInput,
  type ValidatedForward,
  validateForward,
} from "./validate.ts";
import { Issues } from "./validate_layer.ts";
import {
  checkCount,
  checkEnum,
  checkHeld,
  checkLayerFields,
  checkOptional,
  checkSpecFields,
  isPositive,
  isRecord,
  show,
} from "./validate_input.ts";

/** The request form of a host batch (tensors encoded in the batch dtype). */
export function hostInput(b: Omit<ForwardBatch, "cache">, cacheId?: string): ForwardInput {
  const L = b.layer, md = b.metadata;
  const data = (a: Float32Array, rows: number, heads: number): DataTensor => ({
    dtype: b.dtype,
    shape: [rows, heads, L.head_size],
    array: fromFloats(b.dtype, a),
    encoding: "binary",
  });
  const kvRows = b.key ? b.key.length / (L.num_kv_heads * L.head_size) : 0;
  return {
    dtype: b.dtype,
    layer: {
      num_heads: L.num_heads,
      num_kv_heads: L.num_kv_heads,
      head_size: L.head_size,
      scale: L.scale,
      sliding_window: L.sliding_window,
      logits_soft_cap: L.logits_soft_cap,
      alibi_slopes: L.alibi_slopes ? Array.from(L.alibi_slopes) : null,
      sinks: L.sinks ? Array.from(L.sinks) : null,
      attn_type: L.attn_type,
      causal: L.causal,
      k_scale: L.k_scale,
      v_scale: L.v_scale,
    },
    query: data(b.query, b.num_tokens, L.num_heads),
    ...(b.key && b.value
      ? { key: data(b.key, kvRows, L.num_kv_heads), value: data(b.value, kvRows, L.num_kv_heads) }
      : {}),
    metadata: {
      query_start_loc: { shape: [md.num_reqs + 1], values: md.query_start_loc },
      seq_lens: { shape: [md.num_reqs], values: md.seq_lens },
      // Encoder types may leave these out (they use no cache).
      ...(md.block_table
        ? { block_table: { shape: [md.num_reqs, md.max_blocks_per_req], values: md.block_table } }
        : {}),
      ...(md.slot_mapping
        ? { slot_mapping: { shape: [md.slot_mapping.length], values: md.slot_mapping } }
        : {}),
    },
    ...(cacheId !== undefined ? { kv_cache: cacheId } : {}),
    return_lse: b.return_lse,
  };
}

/**
 * The structure of a host batch, which no schema checked: the fields a {@link ForwardBatch}
 * (minus its cache) must have, of their types and typed-array kinds, enums members, counts
 * integers in range, and every array as long as the counts say (the layer's fields are
 * validate_input.ts's). Each problem is an issue naming the field and its current value.
 * Encoder types use no cache: their block_table, max_blocks_per_req and slot_mapping are not
 * read (and may be left out).
 */
function checkHostBatch(b: unknown, is: Issues): void {
  if (!isRecord(b)) {
    is.add([], `a host batch must be an object, got ${show(b)}`);
    return;
  }
  checkEnum(b.dtype, DTYPES, false, is, ["dtype"]);
  const L: Record<string, unknown> = isRecord(b.layer) ? b.layer : {};
  checkLayerFields(b.layer, is);
  const H = isPositive(L.num_heads) ? L.num_heads : null;
  const Hkv = isPositive(L.num_kv_heads) ? L.num_kv_heads : null;
  const D = isPositive(L.head_size) ? L.head_size : null;
  const attn = L.attn_type ?? "decoder";
  const T = checkCount(b.num_tokens, 0, is, ["num_tokens"]) ? b.num_tokens : null;
  const f32 = (v: unknown, path: string): v is Float32Array => {
    if (v instanceof Float32Array) return true;
    is.add([path], `must be a Float32Array, got ${show(v)}`);
    return false;
  };
  if (f32(b.query, "query") && T !== null && H !== null && D !== null) {
    if (b.query.length !== T * H * D) {
      is.add(
        ["query"],
        `has ${b.query.length} elements, expected num_tokens x num_heads x head_size = ${T} x ${H} x ${D} = ${
          T * H * D
        }`,
      );
    }
  }
  const absent = (v: unknown) => v === undefined || v === null;
  if (absent(b.key) !== absent(b.value)) {
    is.add([absent(b.key) ? "key" : "value"], "key and value come together (both or neither)");
  }
  const key = !absent(b.key) && f32(b.key, "key") ? b.key : null;
  const value = !absent(b.value) && f32(b.value, "value") ? b.value : null;
  const row = Hkv !== null && D !== null ? Hkv * D : null;
  if (key && row !== null) {
    const rows = key.length / row;
    if (!Number.isInteger(rows)) {
      is.add(
        ["key"],
        `has ${key.length} elements, not whole rows of num_kv_heads x head_size = ${Hkv} x ${D}`,
      );
    } else if (attn !== "encoder_decoder" && T !== null && rows !== T) {
      is.add(["key"], `has ${rows} rows of ${Hkv} x ${D} but num_tokens is ${T}`);
    }
  }
  if (key && value && value.length !== key.length) {
    is.add(
      ["value"],
      `has ${value.length} elements but key has ${key.length} (both [num_kv_tokens, num_kv_heads, head_size])`,
    );
  }
  checkOptional(b.return_lse, "boolean", false, is, ["return_lse"]);
  const md = b.metadata;
  if (!isRecord(md)) {
    is.add(["metadata"], `must be an object, got ${show(md)}`);
    return;
  }
  const mp = (k: string): (string | number)[] => ["metadata", k];
  const R = checkCount(md.num_reqs, 0, is, mp("num_reqs")) ? md.num_reqs : null;
  const ints = (k: string, want: number | null, rule: string): void => {
    const v = md[k];
    if (!(v instanceof Int32Array)) {
      is.add(mp(k), `must be an Int32Array, got ${show(v)}`);
    } else if (want !== null && v.length !== want) {
      is.add(mp(k), `has ${v.length} entries but ${rule} needs ${want}`);
    }
  };
  ints("query_start_loc", R === null ? null : R + 1, `num_reqs + 1 = ${R} + 1`);
  ints("seq_lens", R, `num_reqs = ${R}`);
  if (attn === "encoder" || attn === "encoder_only") return;
  const M = checkCount(md.max_blocks_per_req, 0, is, mp("max_blocks_per_req"))
    ? md.max_blocks_per_req
    : null;
  ints(
    "block_table",
    R !== null && M !== null ? R * M : null,
    `num_reqs x max_blocks_per_req = ${R} x ${M}`,
  );
  ints("slot_mapping", null, "");
}

/**
 * Validates a host batch over a cache of `spec` (null for encoder types) in `storage`: its
 * structure first ({@link checkHostBatch}: any problem there, all of them, is thrown before the
 * rest reads the batch), then the one validator's rules.
 * @throws the validator's 422s.
 */
export function validateHostBatch(
  b: Omit<ForwardBatch, "cache">,
  spec: KvCacheSpec | null,
  storage: CacheStorage = "webgpu",
  limits: Partial<CallLimits> = DEFAULT_CALL_LIMITS,
): ValidatedForward {
  const is = new Issues();
  checkHostBatch(b, is);
  if (spec !== null && spec !== undefined) checkSpecFields(spec, is, ["cache", "spec"]);
  is.throwIfAny();
  return validateChecked(b, spec ?? null, storage, limits);
}

/** {@link validateHostBatch} of a batch whose structure was checked. */
function validateChecked(
  b: Omit<ForwardBatch, "cache">,
  spec: KvCacheSpec | null,
  storage: CacheStorage,
  limits: Partial<CallLimits>,
): ValidatedForward {
  const isEnc = b.layer.attn_type === "encoder" || b.layer.attn_type === "encoder_only";
  const input = hostInput(b, spec ? "(host batch)" : undefined);
  if (isEnc) {
    delete input.metadata.block_table;
    delete input.metadata.slot_mapping;
  }
  return validateForward(input, spec ? { spec, storage } : null, limits);
}

/**
 * {@link validateHostBatch} with the cache attached: a ValidBatch ready for plan and run. The
 * cache (null or undefined for encoder types) is checked with the batch: a KvCache with a spec
 * and a storage.
 */
export function validHostBatch(b: Omit<ForwardBatch, "cache">, cache: KvCache | null): ValidBatch {
  const is = new Issues();
  checkHeld(cache ?? null, is, ["cache"]);
  checkHostBatch(b, is);
  is.throwIfAny();
  const v = validateChecked(
    b,
    cache?.spec ?? null,
    cache?.storage ?? "webgpu",
    DEFAULT_CALL_LIMITS,
  );
  return attachCache(v.batch, cache ?? null);
}
