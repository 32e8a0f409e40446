/**
 * Element types: rounding to float16 / bfloat16 / fp8, and the little-endian byte encodings
 * shared by host caches, safetensors and GPU buffers (all half and fp8 tensors are stored as
 * raw bytes, which a kernel reads as u32 words).
 *
 * Rounding is round-to-nearest-even everywhere. Overflow: float16/bfloat16 go to ±inf as
 * IEEE does; fp8 saturates to the largest finite value (±448 for e4m3, ±57344 for e5m2), as
 * vLLM's scaled fp8 conversion clamps. NaN stays NaN.
 * @module
 */
import type { DType, KvCacheDType, StorageDType } from "./types.ts";

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/**
 * value → bfloat16 bits (round to nearest even, from the value itself: a float64 such as a JSON
 * number is not rounded to float32 first, which could round twice the same way and land on the
 * wrong side of a bf16 tie).
 */
export function f32ToBf16Bits(x: number): number {
  f32[0] = x;
  let b = u32[0];
  if ((b & 0x7f800000) === 0x7f800000 && (b & 0x7fffff) !== 0) return ((b >>> 16) | 0x40) & 0xffff;
  const f = f32[0];
  if (f !== x && x === x) {
    // Round to odd: the float32 toward zero with its last bit set, so the rounding below still
    // sees that bits were dropped (16 spare bits below bf16's last one are plenty).
    if (Math.abs(f) > Math.abs(x)) b = (b - 1) >>> 0;
    b = (b | 1) >>> 0;
  }
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** bfloat16 bits → value. */
export function bf16BitsToF32(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0];
}

const f16 = new Float16Array(1);
const u16 = new Uint16Array(f16.buffer);

/** value → float16 bits (round to nearest even). */
export function f32ToF16Bits(x: number): number {
  f16[0] = x;
  return u16[0];
}

/** float16 bits → value. */
export function f16BitsToF32(h: number): number {
  u16[0] = h;
  return f16[0];
}

/** Decodes every byte of an fp8 format with `expBits` exponent bits. */
function fp8Table(
  expBits: number,
  mantBits: number,
  bias: number,
  ieeeSpecials: boolean,
): Float64Array {
  const t = new Float64Array(256);
  for (let b = 0; b < 256; b++) {
    const sign = b & 0x80 ? -1 : 1;
    const e = (b >> mantBits) & ((1 << expBits) - 1);
    const m = b & ((1 << mantBits) - 1);
    const maxE = (1 << expBits) - 1;
    if (ieeeSpecials && e === maxE) t[b] = m === 0 ? sign * Infinity : NaN;
    else if (!ieeeSpecials && e === maxE && m === (1 << mantBits) - 1) t[b] = NaN;
    else if (e === 0) t[b] = sign * m * 2 ** (1 - bias - mantBits);
    else t[b] = sign * (1 + m / (1 << mantBits)) * 2 ** (e - bias);
  }
  return t;
}

/** fp8 e4m3 (the "fn" variant: no infinities, max 448) byte → value. */
export const FP8_E4M3_TABLE: Float64Array = fp8Table(4, 3, 7, false);
/** fp8 e5m2 (IEEE-like, max 57344) byte → value. */
export const FP8_E5M2_TABLE: Float64Array = fp8Table(5, 2, 15, true);

/** Sorted non-negative finite codes of a table, for nearest-value search. */
function positiveCodes(t: Float64Array): number[] {
  const codes: number[] = [];
  for (let b = 0; b < 128; b++) if (Number.isFinite(t[b])) codes.push(b);
  return codes.sort((a, b) => t[a] - t[b]);
}
const E4M3_POS = positiveCodes(FP8_E4M3_TABLE);
const E5M2_POS = positiveCodes(FP8_E5M2_TABLE);

function toFp8(x: number, t: Float64Array, pos: number[], nan: number): number {
  if (Number.isNaN(x)) return nan;
  const sign = x < 0 || Object.is(x, -0) ? 0x80 : 0;
  const a = Math.abs(x);
  const top = pos[pos.length - 1];
  if (a >= t[top]) return sign | top; // saturate
  let lo = 0, hi = pos.length - 1; // t[pos[lo]] <= a < t[pos[hi]]
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (t[pos[mid]] <= a) lo = mid;
    else hi = mid;
  }
  const dl = a - t[pos[lo]], dh = t[pos[hi]] - a;
  const pick = dl < dh ? pos[lo] : dh < dl ? pos[hi] : ((pos[lo] & 1) === 0 ? pos[lo] : pos[hi]);
  return sign | pick;
}

/** value → fp8 e4m3 byte (nearest even, saturating). */
export function f32ToFp8E4m3(x: number): number {
  return toFp8(x, FP8_E4M3_TABLE, E4M3_POS, 0x7f);
}
/** value → fp8 e5m2 byte (nearest even, saturating). */
export function f32ToFp8E5m2(x: number): number {
  return toFp8(x, FP8_E5M2_TABLE, E5M2_POS, 0x7f);
}

/** Bytes per element of a storage dtype. */
export function bytesPerElement(d: StorageDType): number {
  return d === "float32" ? 4 : d === "fp8_e4m3" || d === "fp8_e5m2" ? 1 : 2;
}

/** The physical element type of a cache: `auto` means the data dtype, `fp8` e4m3 (vLLM's). */
export function resolveStorage(kv: KvCacheDType, dtype: DType): StorageDType {
  return kv === "auto" ? dtype : kv === "fp8" ? "fp8_e4m3" : kv;
}

/** Rounds one value to a storage dtype (the value the dtype would hold). */
export function roundTo(d: StorageDType, x: number): number {
  switch (d) {
    case "float32":
      return Math.fround(x);
    case "float16":
      return Math.f16round(x);
    case "bfloat16":
      return bf16BitsToF32(f32ToBf16Bits(x));
    case "fp8_e4m3":
      return FP8_E4M3_TABLE[f32ToFp8E4m3(x)];
    case "fp8_e5m2":
      return FP8_E5M2_TABLE[f32ToFp8E5m2(x)];
  }
}

/** Rounds every element in place and returns the array. */
export function roundArray(d: StorageDType, a: Float32Array): Float32Array {
  if (d === "float32") return a;
  if (d === "float16") {
    for (let i = 0; i < a.length; i++) a[i] = Math.f16round(a[i]);
    return a;
  }
  for (let i = 0; i < a.length; i++) a[i] = roundTo(d, a[i]);
  return a;
}

/** Values → little-endian bytes of the storage dtype (values are rounded). */
export function encode(d: StorageDType, values: ArrayLike<number>): Uint8Array {
  const n = values.length;
  switch (d) {
    case "float32":
      return new Uint8Array(Float32Array.from(values).buffer);
    case "float16":
      return new Uint8Array(Float16Array.from(values).buffer);
    case "bfloat16": {
      const out = new Uint16Array(n);
      for (let i = 0; i < n; i++) out[i] = f32ToBf16Bits(values[i]);
      return new Uint8Array(out.buffer);
    }
    case "fp8_e4m3":
    case "fp8_e5m2": {
      const out = new Uint8Array(n);
      const f = d === "fp8_e4m3" ? f32ToFp8E4m3 : f32ToFp8E5m2;
      for (let i = 0; i < n; i++) out[i] = f(values[i]);
      return out;
    }
  }
}

/** Little-endian bytes of the storage dtype → values. `bytes` may be any view. */
export function decode(d: StorageDType, bytes: Uint8Array): Float32Array {
  const n = bytes.byteLength / bytesPerElement(d);
  // Copy to an aligned buffer first: views at odd offsets cannot back wider typed arrays.
  const buf = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
  switch (d) {
    case "float32":
      return new Float32Array(buf.buffer, buf.byteOffset, n).slice();
    case "float16":
      return Float32Array.from(new Float16Array(buf.buffer, buf.byteOffset, n));
    case "bfloat16": {
      const h = new Uint16Array(buf.buffer, buf.byteOffset, n);
      const out = new Float32Array(n);
      const o32 = new Uint32Array(out.buffer);
      for (let i = 0; i < n; i++) o32[i] = h[i] << 16;
      return out;
    }
    case "fp8_e4m3":
    case "fp8_e5m2": {
      const t = d === "fp8_e4m3" ? FP8_E4M3_TABLE : FP8_E5M2_TABLE;
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) out[i] = t[buf[i]];
      return out;
    }
  }
}

/** The safetensors dtype name of a storage dtype (and of int tensors). */
export const SAFETENSORS_DTYPE: Record<StorageDType | "int32" | "int64", string> = {
  float32: "F32",
  float16: "F16",
  bfloat16: "BF16",
  fp8_e4m3: "F8_E4M3",
  fp8_e5m2: "F8_E5M2",
  int32: "I32",
  int64: "I64",
};
