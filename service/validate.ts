/**
 * Validate once: the one step that turns a decoded forward request into a
 * {@link ValidBatch} (through {@link attachCache}, the only place one is built) and the
 * call's {@link SelectorConfig}. Every problem is collected — shapes that disagree with the
 * layer, bad batch metadata, block ids and slots out of range, a block repeated within a
 * request, non-finite values in query/key/value, per-call limits — and thrown at once as one
 * 422 problem: `invalid_batch`, or `limit_exceeded` when the limits are the only problems
 * (both list every issue). An unknown cache id is a 404 answered before validation (see
 * {@link validateForward}). Backends, the cache writer and the plan cache trust what it built.
 * The one exception, on request (`deferFinite`): a large, otherwise valid batch's NaN/infinity
 * scan is left to the GPU plan that runs it, which checks before it writes anything
 * (gpu/finite_check.ts), or to {@link checkFiniteOnHost} for any other plan.
 *
 * A library caller's input did not pass the HTTP schema, so its structure (required fields,
 * types, enums, positive counts, typed-array kinds, tensor lengths against shapes) is checked
 * first (service/validate_input.ts): those problems, all of them, are the same one 422
 * `invalid_batch`, thrown before any other check reads the input.
 *
 * Its parts live beside it: the types it is given and produces (service/validate_types.ts),
 * the query/key/value shapes (service/validate_shapes.ts), the NaN/infinity checks
 * (service/validate_finite.ts) and the selector config (service/validate_selector.ts); their
 * exports are re-exported here.
 * @module
 */
import {
  checksFiniteOnDevice,
  dataArray,
  finiteScanBits,
  fromFloats,
  toFloat32,
  wordsOf,
} from "../core/data.ts";
import type { ForwardInput } from "../wire/codec.ts";
import type { LayerInput } from "../wire/types.ts";
import type { DataTensor } from "../wire/tensors.ts";
import type {
  BatchMetadata,
  BatchShape,
  BatchStats,
  DataArray,
  DType,
  KvCache,
  KvCacheSpec,
  LayerSpec,
  ValidBatch,
} from "../core/types.ts";
import { batchStats, planKey } from "./batch_key.ts";
import { type CheckedMetadata, checkMetadata } from "./validate_metadata.ts";
import { checkCache, checkLayer, Issues, validWindow } from "./validate_layer.ts";
import { checkKeyValueShapes, checkQueryShape } from "./validate_shapes.ts";
import { checkHeld, checkInputFields } from "./validate_input.ts";
import {
  type CallLimits,
  DEFAULT_CALL_LIMITS,
  limitsOver,
  type Over,
  throwProblems,
} from "./call_limits.ts";
import type {
  HeldCacheInfo,
  UnattachedBatch,
  ValidatedForward,
  ValidateOptions,
} from "./validate_types.ts";
import { checkDataFinite } from "./validate_finite.ts";
import { selectorOf } from "./validate_selector.ts";

export { type CallLimits, DEFAULT_CALL_LIMITS } from "./call_limits.ts";
export type {
  HeldCacheInfo,
  UnattachedBatch,
  ValidatedForward,
  ValidateOptions,
} from "./validate_types.ts";
export { checkFiniteOnHost } from "./validate_finite.ts";

export type { ForwardInput, LayerInput };

/**
 * A data tensor's elements in the call's dtype (a view when it came in that dtype, on bytes
 * aligned to 4 as a DataArray's are: a caller's own misaligned view is copied).
 */
function dataOf(t: DataTensor | undefined, dtype: DType): DataArray | null {
  if (!t) return null;
  const a = t.array.bytes.byteOffset % 4 === 0 ? t.array : dataArray(t.dtype, t.array.bytes);
  return a.dtype === dtype ? a : fromFloats(dtype, toFloat32(a));
}

/**
 * Validates a decoded forward request. `held` is the server-held cache named by
 * `input.kv_cache` (the caller resolves the id), or null; `limits` the per-call limits (those
 * left out are {@link DEFAULT_CALL_LIMITS}'s).
 *
 * A library caller's input is not the schema-checked body the HTTP path decodes, so its
 * structure is checked first (service/validate_input.ts: required fields, types, enums,
 * positive counts, typed-array kinds, each tensor's elements against its shape); when that
 * finds problems they are thrown at once, all of them, before any semantic check reads the
 * input (as the HTTP path answers a schema violation before validation runs).
 *
 * An unknown `kv_cache` id is the caller's 404 `cache_not_found`, answered before this runs
 * (service/forward.ts): the held cache's spec is what the batch is checked against (block ids,
 * slots, heads, head size, dtype), so without it most checks could not run, and a missing
 * resource is another status (404) than a batch that cannot run (422); one document has one.
 * @throws ServiceError 422 listing every problem, per-call limits included, in one document:
 *   `invalid_batch` when any batch rule is broken, else `limit_exceeded` for a call whose only
 *   problems are per-call limits (see {@link throwProblems}).
 */
export function validateForward(
  input: ForwardInput,
  held: HeldCacheInfo | null,
  limits: Partial<CallLimits> = DEFAULT_CALL_LIMITS,
  opts: ValidateOptions = {},
): ValidatedForward {
  const is = new Issues();
  checkInputFields(input, is);
  checkHeld(held, is);
  is.throwIfAny();
  const layer = checkLayer(input, is);
  const T = checkQueryShape(input.query, layer, is);
  const Tk = checkKeyValueShapes(input, layer, T, is);
  const { spec, inline } = checkCache(input, layer, held, is);
  const md = checkMetadata(input.metadata, T, Tk, spec, layer.attn_type, is);
  const metadata = batchMetadata(input, md);
  // The per-call limits join the other issues: one answer names every problem.
  const stats = md.counts_valid && validWindow(layer.sliding_window)
    ? batchStats(layer, metadata, md.query_lens)
    : null;
  const over = callOver(layer, T, stats, limits);
  const query = dataOf(input.query, input.dtype)!;
  const key = dataOf(input.key, input.dtype);
  const value = dataOf(input.value, input.dtype);
  const num_kv_tokens = key ? Tk : 0;
  const deferred = defersFinite(opts, input, layer, T, num_kv_tokens, is, over);
  scanFinite(input, "query", query, deferred, is);
  scanFinite(input, "key", key, deferred, is);
  scanFinite(input, "value", value, deferred, is);
  throwProblems(is, over);
  // No issue: the counts and the window were valid, so the stats were computed.
  if (!stats) throw new Error("validateForward: a valid batch without stats");

  const shape = batchShape(input, layer, T, num_kv_tokens, metadata, spec, stats);
  const batch: UnattachedBatch = { ...shape, plan_key: planKey(shape), query, key, value };
  return {
    batch,
    selector: selectorOf(input, layer, spec, held, batch),
    inline,
    finite_deferred: deferred,
  };
}

/** The batch's metadata: the request's starts and lengths, the checked block table and slots. */
function batchMetadata(input: ForwardInput, md: CheckedMetadata): BatchMetadata {
  return {
    num_reqs: md.num_reqs,
    query_start_loc: input.metadata.query_start_loc.values,
    seq_lens: input.metadata.seq_lens.values,
    block_table: md.block_table,
    max_blocks_per_req: md.max_blocks_per_req,
    slot_mapping: md.slot_mapping,
  };
}

/**
 * The per-call limits the call is over: its `T` tokens, its heads and head size, and its
 * attended keys where its counts were valid (`stats` null: not checked).
 */
function callOver(
  layer: LayerSpec,
  T: number,
  stats: BatchStats | null,
  limits: Partial<CallLimits>,
): Over[] {
  const attended_keys = stats?.attended_keys ?? null;
  const { num_heads, head_size } = layer;
  return limitsOver({ num_tokens: T, attended_keys, num_heads, head_size }, limits);
}

/**
 * Whether the whole words of query/key/value are left to the device's NaN/infinity scan: asked
 * for (`opts.deferFinite`), the call has no problem so far, and it is large enough
 * (core/data.ts checksFiniteOnDevice).
 */
function defersFinite(
  opts: ValidateOptions,
  input: ForwardInput,
  layer: LayerSpec,
  T: number,
  num_kv_tokens: number,
  is: Issues,
  over: Over[],
): boolean {
  // A large batch's scan may be left to the device, unless the call fails anyway (then every
  // problem is listed now) or part of a tensor fills no whole word (that part is scanned here).
  return opts.deferFinite === true && is.count === 0 && over.length === 0 &&
    checksFiniteOnDevice({ dtype: input.dtype, layer, num_tokens: T, num_kv_tokens });
}

/** Scans tensor `name` (its elements `a`, in the call's dtype) for NaN and infinity. */
function scanFinite(
  input: ForwardInput,
  name: "query" | "key" | "value",
  a: DataArray | null,
  deferred: boolean,
  is: Issues,
): void {
  const t = input[name];
  // Deferred: only the elements past the last whole word (an odd half-precision tail); a JSON
  // number that overflowed its dtype is named here, with its value.
  const from = deferred && a && !t?.overflow
    ? wordsOf(a.dtype, a.length) * finiteScanBits(a.dtype).per
    : 0;
  checkDataFinite(t, a, name, is, from);
}

/** The batch's shape (all a plan may depend on) but its key: a valid call's. */
function batchShape(
  input: ForwardInput,
  layer: LayerSpec,
  T: number,
  num_kv_tokens: number,
  metadata: BatchMetadata,
  spec: KvCacheSpec | null,
  stats: BatchStats,
): Omit<BatchShape, "plan_key"> {
  return {
    dtype: input.dtype,
    layer,
    num_tokens: T,
    num_kv_tokens,
    metadata,
    cache_spec: spec,
    return_lse: input.return_lse ?? false,
    stats,
  };
}

/**
 * The validated batch with its cache: the only constructor of a {@link ValidBatch}. The
 * cache must have the validated spec (the held cache, or the inline one imported by the
 * chosen backend); null exactly when the batch uses none.
 * @throws Error when the cache does not match (a programming error, not a client one).
 */
export function attachCache(b: UnattachedBatch, cache: KvCache | null): ValidBatch {
  const want = b.cache_spec;
  if ((want === null) !== (cache === null)) {
    throw new Error(`attachCache: the batch ${want ? "needs" : "uses no"} cache`);
  }
  if (want && cache) {
    const have = cache.spec as unknown as Record<string, unknown>;
    for (const [k, v] of Object.entries(want)) {
      if (have[k] !== v) {
        throw new Error(`attachCache: the cache's ${k} is ${have[k]}, the validated spec's ${v}`);
      }
    }
  }
  // A cache known to hold no fp8 NaN byte gets plans (kernels) of its own.
  const nanFree = cache?.fp8_nan_free === true;
  const plan_key = nanFree ? `${b.plan_key}|nan-free` : b.plan_key;
  return { ...b, cache, plan_key, cache_nan_free: nanFree } as unknown as ValidBatch;
}
