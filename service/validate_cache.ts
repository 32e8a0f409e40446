/**
 * The cache checks of forward validation: a held cache's spec against the call, an inline
 * cache's spec read from `key_cache.shape`, and the inline bytes the call keeps
 * (service/validate_layer.ts checkCache runs them).
 * @module
 */
import { CACHE_SPEC_RULES, ruleProblem } from "../core/cache_spec.ts";
import type { DType, KvCacheDType, KvCacheSpec, KvLayout, LayerSpec } from "../core/types.ts";
import type { CacheTensor } from "../wire/tensors.ts";
import type { ForwardInput } from "./validate.ts";
import type { Issues } from "./validate_layer.ts";

/** The size fields of a cache spec: an inline cache's shape axes. */
type SizeField = "num_blocks" | "block_size" | "num_kv_heads" | "head_size";

/**
 * Checks a held cache's spec `s` against the layer, the call's dtype and the layout it names;
 * adds an issue for each way they differ.
 */
export function checkHeldCache(
  input: ForwardInput,
  layer: LayerSpec,
  s: KvCacheSpec,
  is: Issues,
): void {
  if (s.num_kv_heads !== layer.num_kv_heads) {
    is.add(
      ["layer", "num_kv_heads"],
      `is ${layer.num_kv_heads} but cache ${input.kv_cache} has ${s.num_kv_heads}`,
    );
  }
  if (s.head_size !== layer.head_size) {
    is.add(
      ["layer", "head_size"],
      `is ${layer.head_size} but cache ${input.kv_cache} has ${s.head_size}`,
    );
  }
  if (s.dtype !== input.dtype) {
    is.add(["dtype"], `is ${input.dtype} but cache ${input.kv_cache} was created for ${s.dtype}`);
  }
  // The layout is the held cache's; a call that names another one contradicts it (it was
  // ignored before: session 38's audit).
  const named = input.kv_cache_layout;
  if (named !== undefined && named !== s.layout) {
    is.add(["kv_cache_layout"], `is ${named} but cache ${input.kv_cache} is ${s.layout}`);
  }
}

/**
 * Whether size `v` of `key_cache.shape[axis]` keeps the rule of its spec field (core/cache_spec.ts
 * CACHE_SPEC_RULES, the rule importCache's checkCacheSpec keeps); adds the rule's words at that
 * axis when it does not.
 */
function sizeAxisOk(field: SizeField, axis: number, v: number, is: Issues): boolean {
  const problem = ruleProblem(CACHE_SPEC_RULES[field], v);
  if (problem === null) return true;
  is.add(["key_cache", "shape", axis], `${field} axis ${problem}`);
  return false;
}

/**
 * The spec of an inline cache read from `kc.shape` (4-D, in `layout`), or null when a size
 * breaks its rule, disagrees with the layer, or the cache's dtype cannot serve the call's
 * `dtype`; adds an issue for each such problem, named at its axis of `key_cache.shape`.
 */
export function specFromShape(
  kc: CacheTensor,
  layout: KvLayout,
  dtype: DType,
  layer: LayerSpec,
  is: Issues,
): KvCacheSpec | null {
  const [num_blocks, a, b, d] = kc.shape;
  const nhd = layout === "NHD";
  const block_size = nhd ? a : b;
  const heads = nhd ? b : a;
  const hAxis = nhd ? 2 : 1;
  let ok = sizeAxisOk("num_blocks", 0, num_blocks, is);
  if (!sizeAxisOk("block_size", hAxis === 2 ? 1 : 2, block_size, is)) ok = false;
  if (!sizeAxisOk("num_kv_heads", hAxis, heads, is)) ok = false;
  else if (heads !== layer.num_kv_heads) {
    is.add(
      ["key_cache", "shape", hAxis],
      `num_kv_heads axis is ${heads} but layer.num_kv_heads is ${layer.num_kv_heads}`,
    );
    ok = false;
  }
  if (!sizeAxisOk("head_size", 3, d, is)) ok = false;
  else if (d !== layer.head_size) {
    is.add(
      ["key_cache", "shape", 3],
      `head_size axis is ${d} but layer.head_size is ${layer.head_size}`,
    );
    ok = false;
  }
  const kv_cache_dtype = inlineCacheDtype(kc, dtype, is);
  if (!ok || kv_cache_dtype === null) return null;
  return {
    num_blocks,
    block_size,
    num_kv_heads: heads,
    head_size: d,
    dtype,
    kv_cache_dtype,
    layout,
  };
}

/**
 * The `kv_cache_dtype` of an inline cache for a call of `dtype`: `auto` when it is stored in
 * that dtype, else its own (an fp8 or 16-bit cache), or null (an issue added) for a float32
 * cache under another dtype.
 */
function inlineCacheDtype(
  kc: CacheTensor,
  dtype: DType,
  is: Issues,
): KvCacheDType | null {
  if (kc.dtype === dtype) return "auto";
  if (kc.dtype !== "float32") return kc.dtype;
  is.add(["key_cache", "dtype"], `a float32 cache needs dtype float32, got dtype ${dtype}`);
  return null;
}

/**
 * Inline cache bytes aligned to 8, as the wire decoders leave them (a caller's own misaligned
 * view is copied).
 */
export function alignedBytes(b: Uint8Array): Uint8Array {
  return b.byteOffset % 8 === 0 ? b : b.slice();
}
