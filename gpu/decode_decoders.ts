/**
 * The word decoders of the WEBGPU_DECODE split kernel (wgsl/decode_words.wgsl): per storage
 * dtype the WGSL expressions that turn a vec4<u32> word `w` into vec4<f32> values
 * ({@link DECODERS}), fp8 also in byte pairs ({@link PAIR_DECODERS}) and e4m3 without the NaN
 * fix-up ({@link NAN_FREE_DECODERS}), and the factor each dtype's decoders leave out
 * ({@link DECODE_SCALE}).
 * @module
 */
import type { StorageDType } from "../core/types.ts";

/** Decoders of a vec4<u32> word `w` into vec4<f32> values, per storage dtype. */
export const DECODERS: Record<StorageDType, string[]> = {
  float32: ["bitcast<vec4<f32>>(w)"],
  float16: [
    "vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y))",
    "vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w))",
  ],
  bfloat16: ["vec4<f32>(bf2(w.x), bf2(w.y))", "vec4<f32>(bf2(w.z), bf2(w.w))"],
  fp8_e4m3: ["e4m3x4(w.x)", "e4m3x4(w.y)", "e4m3x4(w.z)", "e4m3x4(w.w)"],
  fp8_e5m2: ["e5m2x4(w.x)", "e5m2x4(w.y)", "e5m2x4(w.z)", "e5m2x4(w.w)"],
};

/**
 * fp8 decoders in even / odd byte pairs (wgsl/decode_words.wgsl e4m3x4s, e5m2x4s): fewer integer
 * ops a word, each vec4 in the order (0, 2, 1, 3) of its word's elements (tuning `fp8_pairs`).
 */
export const PAIR_DECODERS: Partial<Record<StorageDType, string[]>> = {
  fp8_e4m3: ["e4m3x4s(w.x)", "e4m3x4s(w.y)", "e4m3x4s(w.z)", "e4m3x4s(w.w)"],
  fp8_e5m2: ["e5m2x4s(w.x)", "e5m2x4s(w.y)", "e5m2x4s(w.z)", "e5m2x4s(w.w)"],
};

/**
 * e4m3 decoders without the NaN fix-up (wgsl/decode_words.wgsl e4m3x4f, e4m3x4sf), for a cache
 * known to hold no NaN byte (gpu/kv_cache.ts `fp8_nan_free`); word order, then pairs.
 */
export const NAN_FREE_DECODERS: { words: string[]; pairs: string[] } = {
  words: ["e4m3x4f(w.x)", "e4m3x4f(w.y)", "e4m3x4f(w.z)", "e4m3x4f(w.w)"],
  pairs: ["e4m3x4sf(w.x)", "e4m3x4sf(w.y)", "e4m3x4sf(w.z)", "e4m3x4sf(w.w)"],
};

/**
 * The factor each storage dtype's decoders leave out (their values are the element's value
 * divided by it): the plan multiplies the score and value scales by it. fp8 e4m3 decodes
 * through f16 bit positions, 2^-8 of the value.
 */
export const DECODE_SCALE: Record<StorageDType, number> = {
  float32: 1,
  float16: 1,
  bfloat16: 1,
  fp8_e4m3: 256,
  fp8_e5m2: 1,
};
