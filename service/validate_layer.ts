/**
 * The layer and cache checks of forward validation, and the issue collector they share.
 * @module
 */
import { invalidBatch, type Issue, MAX_LISTED_ISSUES, withNotListed } from "../core/errors.ts";
import type { AttnType, KvCacheSpec, KvLayout, LayerSpec } from "../core/types.ts";
import type { CacheTensor } from "../wire/tensors.ts";
import type { ForwardInput, HeldCacheInfo, ValidatedForward } from "./validate.ts";
import { alignedBytes, checkHeldCache, specFromShape } from "./validate_cache.ts";

/** Collects issues (up to MAX_LISTED_ISSUES) and throws them all as one invalid_batch. */
export class Issues {
  readonly list: Issue[] = [];
  dropped = 0;
  /** Every issue added, those past MAX_LISTED_ISSUES included. */
  get count(): number {
    return this.list.length + this.dropped;
  }
  add(path: (string | number)[], message: string): void {
    if (this.list.length < MAX_LISTED_ISSUES) this.list.push({ path, message });
    else this.dropped++;
  }
  /**
   * The listed issues, then `also` (listed whatever the cap: the few call-level problems, such
   * as per-call limits), then one line counting those not listed.
   */
  listed(also: Issue[] = []): Issue[] {
    return withNotListed([...this.list, ...also], this.dropped);
  }
  throwIfAny(): void {
    if (this.count === 0) return;
    throw invalidBatch(this.listed());
  }
}

/** A short rendering of an array. */
export const fmt = (a: ArrayLike<number>) => {
  const s = `[${Array.from(a).slice(0, 16).join(", ")}${a.length > 16 ? ", ..." : ""}]`;
  return s;
};
/** Equal shapes. */
export const eqShape = (a: number[], b: number[]) =>
  a.length === b.length && a.every((x, i) => x === b[i]);
/** A valid `sliding_window`: null (none) or an integer >= 1. */
export const validWindow = (sw: number | null): boolean =>
  sw === null || (Number.isInteger(sw) && sw >= 1);
/** Encoder types take K/V from the call and use no cache. */
export const isEncoder = (t: AttnType) => t === "encoder" || t === "encoder_only";

/** Resolves the layer's defaults and checks its parameters. */
export function checkLayer(input: ForwardInput, is: Issues): LayerSpec {
  const l = input.layer;
  const attn_type: AttnType = l.attn_type ?? "decoder";
  const p = (k: string) => ["layer", k];
  if (l.num_kv_heads > 0 && l.num_heads % l.num_kv_heads !== 0) {
    is.add(
      p("num_heads"),
      `num_heads ${l.num_heads} is not a multiple of num_kv_heads ${l.num_kv_heads}`,
    );
  }
  const scale = l.scale ?? 1 / Math.sqrt(l.head_size);
  const scaleWhy = scaleProblem(scale, KERNELS_F32, { orNull: true });
  if (scaleWhy) is.add(p("scale"), scaleWhy);
  const sw = l.sliding_window ?? null;
  if (!validWindow(sw)) {
    is.add(p("sliding_window"), `must be an integer >= 1 (or null), got ${sw}`);
  }
  const cap = l.logits_soft_cap ?? null;
  const capWhy = cap === null ? null : scaleProblem(cap, KERNELS_F32, { orNull: true });
  if (capWhy) is.add(p("logits_soft_cap"), capWhy);
  const vec = (k: "alibi_slopes" | "sinks"): Float32Array | null => {
    const v = l[k];
    if (v === undefined || v === null) return null;
    if (v.length !== l.num_heads) {
      is.add(p(k), `has ${v.length} entries but num_heads is ${l.num_heads}`);
    }
    const out = new Float32Array(v.length);
    for (let i = 0; i < v.length; i++) {
      const x = v[i];
      const why = float32Problem(x);
      if (why) is.add([...p(k), i], why);
      out[i] = x;
    }
    return out;
  };
  const alibi_slopes = vec("alibi_slopes");
  const sinks = vec("sinks");
  const causal = l.causal ?? attn_type === "decoder";
  if (causal && attn_type === "encoder_decoder") {
    is.add(p("causal"), "cross-attention (encoder_decoder) cannot be causal, got true");
  }
  const kq = (k: "k_scale" | "v_scale") => {
    const v = l[k] ?? 1;
    const why = scaleProblem(v);
    if (why) is.add(p(k), why);
    return v;
  };
  return {
    num_heads: l.num_heads,
    num_kv_heads: l.num_kv_heads,
    head_size: l.head_size,
    scale,
    sliding_window: sw,
    logits_soft_cap: cap,
    alibi_slopes,
    sinks,
    attn_type,
    causal,
    k_scale: kq("k_scale"),
    v_scale: kq("v_scale"),
  };
}

/** What checkCache resolves: the call's cache spec and its inline cache, or nulls. */
type CacheCheck = { spec: KvCacheSpec | null; inline: ValidatedForward["inline"] };

/**
 * Resolves the cache spec of the call (held or inline) and checks it against the layer. An
 * inline cache's spec is read from `key_cache.shape`: each of its sizes keeps its rule of
 * core/cache_spec.ts CACHE_SPEC_RULES (the rule every cache maker checks), refused in the
 * rule's words at its axis, `key_cache.shape[axis]`, so no spec field the request lacks
 * (`num_blocks`) is ever named later.
 */
export function checkCache(
  input: ForwardInput,
  layer: LayerSpec,
  held: HeldCacheInfo | null,
  is: Issues,
): CacheCheck {
  const hasInline = input.key_cache !== undefined || input.value_cache !== undefined;
  if (refusesCacheUse(input, layer, held, hasInline, is)) return { spec: null, inline: null };
  if (held) {
    const s = held.spec;
    checkHeldCache(input, layer, s, is);
    return { spec: s, inline: null };
  }
  return checkInlineCache(input, layer, is);
}

/**
 * Whether the call's use of a cache is refused (an issue added): a held cache and an inline
 * one both given, a cache given to an attention type that uses none (encoders), or none given
 * to one that needs one.
 */
function refusesCacheUse(
  input: ForwardInput,
  layer: LayerSpec,
  held: HeldCacheInfo | null,
  hasInline: boolean,
  is: Issues,
): boolean {
  if (held && hasInline) {
    is.add(
      ["kv_cache"],
      `give either kv_cache (${input.kv_cache}) or inline key_cache/value_cache, not both`,
    );
    return true;
  }
  if (isEncoder(layer.attn_type)) {
    if (held || hasInline) {
      is.add(
        held ? ["kv_cache"] : ["key_cache"],
        `attn_type ${layer.attn_type} uses no KV cache; remove it`,
      );
    }
    return true;
  }
  if (!held && !hasInline) {
    is.add(
      ["kv_cache"],
      `attn_type ${layer.attn_type} needs a KV cache: kv_cache id or key_cache + value_cache`,
    );
    return true;
  }
  return false;
}

/**
 * The spec and bytes of the call's inline cache (`key_cache` + `value_cache`), or nulls when
 * one is missing, they disagree, `key_cache` is not 4-D, or its spec is refused.
 */
function checkInlineCache(input: ForwardInput, layer: LayerSpec, is: Issues): CacheCheck {
  const kc = input.key_cache, vc = input.value_cache;
  if (!kc || !vc) {
    is.add([kc ? "value_cache" : "key_cache"], "inline caches need both key_cache and value_cache");
    return { spec: null, inline: null };
  }
  const paired = inlinePairAgrees(kc, vc, is);
  const layout: KvLayout = input.kv_cache_layout ?? "NHD";
  if (kc.shape.length !== 4) {
    is.add(["key_cache", "shape"], `must be 4-D (${layout}), got ${fmt(kc.shape)}`);
    return { spec: null, inline: null };
  }
  const spec = specFromShape(kc, layout, input.dtype, layer, is);
  if (!paired || spec === null) return { spec: null, inline: null };
  return { spec, inline: { spec, key: alignedBytes(kc.bytes), value: alignedBytes(vc.bytes) } };
}

/** Whether `value_cache` has `key_cache`'s dtype and shape; adds an issue for each it lacks. */
function inlinePairAgrees(kc: CacheTensor, vc: CacheTensor, is: Issues): boolean {
  let ok = true;
  if (kc.dtype !== vc.dtype) {
    is.add(["value_cache", "dtype"], `is ${vc.dtype} but key_cache is ${kc.dtype}`);
    ok = false;
  }
  if (!eqShape(kc.shape, vc.shape)) {
    is.add(["value_cache", "shape"], `is ${fmt(vc.shape)} but key_cache is ${fmt(kc.shape)}`);
    ok = false;
  }
  return ok;
}

/** The smallest normal float32 (2^-126): GPUs flush smaller magnitudes to 0. */
const F32_MIN_NORMAL = 2 ** -126;

/**
 * Why a positive value the kernels take as a float32 cannot be used, or null: an fp8 scale
 * (`k_scale`, `v_scale`: float32 values, docs/api.md), the score `scale`, the `logits_soft_cap`
 * (`why` says which in the message; `orNull`: null is allowed too, as for the score scale and
 * the soft cap). One must be finite and > 0 as a float64 and as the float32 it becomes, and not
 * a float32 subnormal, which GPUs flush to 0 (1e39 became Infinity and 1e-46 became 0
 * unrefused, and the backends disagreed on them).
 */
export function scaleProblem(
  v: number,
  why = "scales are float32",
  { orNull = false }: { orNull?: boolean } = {},
): string | null {
  if (!Number.isFinite(v) || v <= 0) {
    return `must be finite and > 0${orNull ? " (or null)" : ""}, got ${v}`;
  }
  const f = Math.fround(v);
  if (!Number.isFinite(f)) return `must be finite as a float32 (${why}), got ${v}`;
  if (f < F32_MIN_NORMAL) {
    return `must be at least ${F32_MIN_NORMAL} as a float32 (${why}; GPUs flush ` +
      `smaller values to 0), got ${v}`;
  }
  return null;
}

/** Why the kernels' float32 copy of a layer value differs in kind from the value sent. */
const KERNELS_F32 = "the kernels take it as a float32";

/**
 * Why a value the kernels take as a float32 (a sink, an ALiBi slope) cannot be used, or null:
 * finite as a float64 and as that float32 (1e39 passed as finite and became Infinity: 200 with
 * NaN heads, on CPU_REFERENCE too, in the HTTP audit of session 38).
 */
function float32Problem(v: number): string | null {
  if (!Number.isFinite(v)) return `must be finite, got ${v}`;
  if (!Number.isFinite(Math.fround(v))) {
    return `must be finite as a float32 (${KERNELS_F32}), got ${v}`;
  }
  return null;
}
