/**
 * Data tensors as dtype bytes ({@link DataArray}): building them from float values (rounded
 * to the dtype), viewing or converting them as float32, finding the first non-finite
 * element without decoding, and the float32 host form of a validated batch that the float64
 * reference computes on.
 * @module
 */
import { bytesPerElement, decode, encode } from "./dtype.ts";
import type { DataArray, DType, ForwardBatch, KvCache, ValidBatch } from "./types.ts";

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

/**
 * Index of the first NaN or infinite element, or -1. Reads the exponent bits of each element
 * in place (no decode): float32 0x7f800000, float16 0x7c00, bfloat16 0x7f80.
 */
export function firstNonFinite(a: DataArray): number {
  const b = a.bytes;
  if (a.dtype === "float32") {
    const w = new Uint32Array(b.buffer, b.byteOffset, a.length);
    for (let i = 0; i < w.length; i++) if ((w[i] & 0x7f800000) === 0x7f800000) return i;
    return -1;
  }
  const h = new Uint16Array(b.buffer, b.byteOffset, a.length);
  const e = a.dtype === "float16" ? 0x7c00 : 0x7f80;
  for (let i = 0; i < h.length; i++) if ((h[i] & e) === e) return i;
  return -1;
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
