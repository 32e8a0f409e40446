/**
 * Data tensors as dtype bytes ({@link DataArray}): building them from float values (rounded
 * to the dtype), viewing or converting them as float32, finding the first non-finite
 * element without decoding, and the float32 host form of a validated batch that the float64
 * reference computes on.
 * @module
 */
import { bf16BitsToF32, bytesPerElement, decode, encode, f16BitsToF32 } from "./dtype.ts";
import type { DataArray, DType, ForwardBatch, KvCache, ValidBatch } from "./types.ts";
import { envInt, type EnvSetting, readSetting } from "./env.ts";

/** A DataArray over `bytes` (which must hold `bytes.byteLength / size` whole elements). */
export function dataArray(dtype: DType, bytes: Uint8Array): DataArray {
  const size = bytesPerElement(dtype);
  if (bytes.byteLength % size !== 0) {
    throw new RangeError(`${bytes.byteLength} bytes is not a whole number of ${dtype} elements`);
  }
  const aligned = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
  return { dtype, length: aligned.byteLength / size, bytes: aligned };
}

/** Values rounded to `dtype` (nearest even) and encoded. */
export function fromFloats(dtype: DType, values: ArrayLike<number>): DataArray {
  return dataArray(dtype, encode(dtype, values));
}

/** The values as float32 (a view for aligned float32 data, else a decoded copy). */
export function toFloat32(a: DataArray): Float32Array {
  if (a.dtype === "float32") return new Float32Array(a.bytes.buffer, a.bytes.byteOffset, a.length);
  return decode(a.dtype, a.bytes);
}

/** An all-NaN array of `length` elements of `dtype` (a poisoned output). */
export function nanArray(dtype: DType, length: number): DataArray {
  return fromFloats(dtype, new Float32Array(length).fill(NaN));
}

/** Exponent masks of the finiteness scan: a field of all ones is NaN or infinite. */
const SCAN = {
  /** One element per 32-bit word. */
  float32: { mask: 0x7f800000, carry: 0x00800000, sign: 0x80000000 | 0, per: 1 },
  /** Two elements per word, both exponent fields tested at once. */
  float16: { mask: 0x7c007c00, carry: 0x04000400, sign: 0x80008000 | 0, per: 2 },
  bfloat16: { mask: 0x7f807f80, carry: 0x00800080, sign: 0x80008000 | 0, per: 2 },
} as const;

/**
 * A dtype's finiteness-scan bits: exponent masks, carry and sign of the elements of one 32-bit
 * word, and elements per word. The host scan here and the device's (gpu/finite_check.ts) share
 * them.
 */
export function finiteScanBits(
  dtype: DType,
): { mask: number; carry: number; sign: number; per: number } {
  const k = SCAN[dtype];
  return { mask: k.mask, carry: k.carry, sign: k.sign >>> 0, per: k.per };
}

/** How a NaN or infinite element is reported, by the host's check and the device's alike. */
export function nonFiniteMessage(a: DataArray, i: number): string {
  return `element ${i} is ${elementAt(a, i)} in ${a.dtype}: tensors must be finite`;
}

/** Words scanned between two tests of the accumulated flags. */
const SCAN_BLOCK = 4096;

/** Whether element `i` of `a` is NaN or infinite (its exponent field all ones). */
function elementNonFinite(a: DataArray, i: number): boolean {
  const b = a.bytes;
  if (a.dtype === "float32") {
    const w = b[4 * i] | (b[4 * i + 1] << 8) | (b[4 * i + 2] << 16) | (b[4 * i + 3] << 24);
    return (w & 0x7f800000) === 0x7f800000;
  }
  const h = b[2 * i] | (b[2 * i + 1] << 8), e = a.dtype === "float16" ? 0x7c00 : 0x7f80;
  return (h & e) === e;
}

/** First non-finite element of `a` in [from, to) by testing each one, or -1. */
export function firstNonFiniteIn(a: DataArray, from: number, to: number): number {
  for (let i = from; i < to; i++) if (elementNonFinite(a, i)) return i;
  return -1;
}

/**
 * Index of the first NaN or infinite element, or -1. Reads the exponent bits in place (no
 * decode), 32 bits at a time: a word's exponent field(s) masked and added one unit of their
 * lowest bit carry into the field's sign bit exactly when a field is all ones (float32
 * 0x7f800000; float16 0x7c00 and bfloat16 0x7f80 in each half). The sums are OR-ed over a
 * block of words and tested once per block; only a block that tests positive is searched
 * element by element.
 */
export function firstNonFinite(a: DataArray): number {
  const b = a.bytes, k = SCAN[a.dtype];
  if (b.byteOffset % 4 !== 0) return firstNonFiniteIn(a, 0, a.length);
  const words = Math.floor(a.length / k.per);
  const w = new Int32Array(b.buffer, b.byteOffset, words);
  const mask = k.mask, carry = k.carry, sign = k.sign;
  for (let s = 0; s < words; s += SCAN_BLOCK) {
    const end = Math.min(words, s + SCAN_BLOCK);
    let acc = 0;
    for (let i = s; i < end; i++) acc |= ((w[i] & mask) + carry) | 0;
    if ((acc & sign) !== 0) return firstNonFiniteIn(a, s * k.per, end * k.per);
  }
  return firstNonFiniteIn(a, words * k.per, a.length);
}

/** Whole 32-bit words of `n` elements of `dtype` (an odd half-precision tail is not one). */
export function wordsOf(dtype: DType, n: number): number {
  return dtype === "float32" ? n : Math.floor(n / 2);
}

/** `ATTN_DEVICE_FINITE_BYTES`: an integer >= 0 (bytes), default 64 KiB (see below). */
export const DEVICE_FINITE_BYTES_SETTING: EnvSetting<number> = {
  name: "ATTN_DEVICE_FINITE_BYTES",
  unset: 64 << 10,
  parse: (text) => envInt("ATTN_DEVICE_FINITE_BYTES", text, 0, undefined, " (bytes)"),
};

let finiteBytes: number | undefined;

/**
 * Batches whose query/key/value hold at least this many bytes have their finiteness checked
 * by the GPU plan that runs them (gpu/finite_check.ts) rather than scanned on the host, when
 * the plan says it does (`checks_finite`); smaller ones are always scanned on the host.
 * 64 KiB by default (`ATTN_DEVICE_FINITE_BYTES` sets it): the host scans ~6 GB/s (2-core dev
 * VM), so 64 KiB is ~10 us, about what the check's two dispatches add to a call's encoding on
 * Dawn; issue 7's decode step (393 KB) is checked on the device (validate 0.16-0.19 -> 0.09 ms
 * there, host_profile). Read once, at first use, not as this module loads (server/main.ts
 * loads it before it checks the environment): a bad value fails that use with an
 * EnvValueError naming it, and each later one.
 */
export function deviceFiniteCheckBytes(): number {
  return finiteBytes ??= readSetting(DEVICE_FINITE_BYTES_SETTING);
}

/** Elements of query, key and value of a batch shape. */
export function dataElements(s: {
  layer: { num_heads: number; num_kv_heads: number; head_size: number };
  num_tokens: number;
  num_kv_tokens: number;
}): [number, number, number] {
  const kv = s.num_kv_tokens * s.layer.num_kv_heads * s.layer.head_size;
  return [s.num_tokens * s.layer.num_heads * s.layer.head_size, kv, kv];
}

/** Whether a batch of this shape may leave its finiteness to the device (see above). */
export function checksFiniteOnDevice(s: {
  dtype: DType;
  layer: { num_heads: number; num_kv_heads: number; head_size: number };
  num_tokens: number;
  num_kv_tokens: number;
}): boolean {
  const [q, k, v] = dataElements(s);
  return (q + k + v) * bytesPerElement(s.dtype) >= deviceFiniteCheckBytes();
}

/** Element `i` of `a` as a number (one element decoded). */
export function elementAt(a: DataArray, i: number): number {
  const b = a.bytes;
  if (a.dtype === "float32") {
    return new DataView(b.buffer, b.byteOffset, b.byteLength).getFloat32(4 * i, true);
  }
  const h = b[2 * i] | (b[2 * i + 1] << 8);
  return a.dtype === "float16" ? f16BitsToF32(h) : bf16BitsToF32(h);
}

/** The float32 host form of a validated batch (tensors decoded; metadata shared). */
export function hostBatch(b: ValidBatch, cache: KvCache | null = b.cache): ForwardBatch {
  return {
    dtype: b.dtype,
    layer: b.layer,
    num_tokens: b.num_tokens,
    query: toFloat32(b.query).slice(),
    key: b.key ? toFloat32(b.key).slice() : null,
    value: b.value ? toFloat32(b.value).slice() : null,
    metadata: b.metadata,
    cache,
    return_lse: b.return_lse,
  };
}
