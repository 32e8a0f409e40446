/**
 * Role-specific decoding of a {@link RawTensor} (wire/tensors.ts) into typed host arrays:
 * - data tensors (query/key/value): {@link DataArray}s of their dtype (bytes as they came, or
 *   JSON numbers rounded and encoded); finiteness is checked by validation (422);
 * - cache tensors (key_cache/value_cache): raw little-endian bytes in their storage dtype;
 * - int tensors (metadata): Int32Array (int64 values must fit in int32).
 *
 * A dtype the role does not take, or a non-integer metadata value, is a 400 naming the tensor's
 * path; an int64 value outside the int32 range is a 422.
 * @module
 */
import { dataArray, firstNonFinite, fromFloats } from "../core/data.ts";
import { encode } from "../core/dtype.ts";
import { invalidBatch } from "../core/errors.ts";
import { numel } from "../core/safetensors.ts";
import type { DataArray, DType, StorageDType } from "../core/types.ts";
import { fail, type Path, show } from "./tensor_error.ts";
import type { RawTensor, TensorEncoding } from "./tensors.ts";

/** A data tensor: its elements in `dtype` (JSON numbers rounded; bytes used as they came). */
export interface DataTensor {
  dtype: DType;
  shape: number[];
  array: DataArray;
  encoding: TensorEncoding;
  /**
   * JSON numbers only: the first non-finite element of `array`, where it came from a finite
   * number too large for `dtype` (70000 in float16): its index and the number sent, for the
   * validator's message.
   */
  overflow?: { index: number; value: number };
}

/** A cache tensor: raw bytes of its storage dtype. */
export interface CacheTensor {
  dtype: StorageDType;
  shape: number[];
  bytes: Uint8Array;
}

/** An integer (metadata) tensor. */
export interface IntTensor {
  shape: number[];
  values: Int32Array;
}

const DATA_DTYPES = ["float32", "float16", "bfloat16"];
const CACHE_DTYPES = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"];
const INT_DTYPES = ["int32", "int64"];

/** Flat index → per-dimension indices of a row-major shape. */
function unravel(i: number, shape: number[]): number[] {
  const out = new Array<number>(shape.length);
  for (let d = shape.length - 1; d >= 0; d--) {
    out[d] = shape[d] > 0 ? i % shape[d] : 0;
    i = shape[d] > 0 ? Math.floor(i / shape[d]) : 0;
  }
  return out;
}

function requireDtype(raw: RawTensor, allowed: string[], role: string, path: Path): void {
  if (!allowed.includes(raw.dtype)) {
    throw fail(
      [...path, "dtype"],
      `${role} tensors must be one of ${allowed.join(", ")}, got ${show(raw.dtype)}`,
    );
  }
}

function aligned(b: Uint8Array): Uint8Array {
  return b.byteOffset % 8 === 0 ? b : b.slice();
}

/**
 * → data tensor: the dtype's bytes (a view of the wire bytes when aligned; JSON numbers encoded,
 * the first that overflowed the dtype noted).
 */
export function toDataTensor(raw: RawTensor, path: Path): DataTensor {
  requireDtype(raw, DATA_DTYPES, "data", path);
  const dtype = raw.dtype as DType;
  if (raw.bytes) {
    return { dtype, shape: raw.shape, array: dataArray(dtype, raw.bytes), encoding: raw.encoding };
  }
  const array = fromFloats(dtype, raw.numbers!);
  const t: DataTensor = { dtype, shape: raw.shape, array, encoding: raw.encoding };
  const i = firstNonFinite(array);
  if (i >= 0 && Number.isFinite(raw.numbers![i])) t.overflow = { index: i, value: raw.numbers![i] };
  return t;
}

/** → cache tensor: bytes in the storage dtype (`data` numbers are encoded, bytes taken as is). */
export function toCacheTensor(raw: RawTensor, path: Path): CacheTensor {
  requireDtype(raw, CACHE_DTYPES, "cache", path);
  const dtype = raw.dtype as StorageDType;
  const bytes = raw.bytes ? aligned(raw.bytes) : encode(dtype, raw.numbers!);
  return { dtype, shape: raw.shape, bytes };
}

/** → int tensor: Int32Array. Non-integers are 400; int64 values outside int32 are 422. */
export function toIntTensor(raw: RawTensor, path: Path): IntTensor {
  requireDtype(raw, INT_DTYPES, "integer", path);
  const n = numel(raw.shape);
  const values = new Int32Array(n);
  const at = (i: number): Path =>
    raw.encoding === "data"
      ? [...path, "data", i]
      : raw.encoding === "array"
      ? [...path, ...unravel(i, raw.shape)]
      : [...path, i];
  // The value as sent: float64 reads 9007199254740993 as ...992 (wire/json_literals.ts).
  const sent = (i: number, v: number | bigint) =>
    (typeof v === "number" ? raw.literal?.(at(i)) : undefined) ?? String(v);
  const outOfRange = (i: number, v: number | bigint) =>
    invalidBatch([{
      path: at(i),
      message: `value ${sent(i, v)} does not fit in int32 [-2147483648, 2147483647]`,
    }]);
  if (raw.numbers) {
    const src = raw.numbers;
    for (let i = 0; i < n; i++) {
      const v = src[i];
      if (!Number.isInteger(v) && Number.isFinite(v)) {
        throw fail(at(i), `expected an integer, got ${show(v)}`);
      }
      if (v < -2147483648 || v > 2147483647) {
        if (raw.dtype === "int32") throw fail(at(i), `value ${sent(i, v)} is not an int32`);
        throw outOfRange(i, v);
      }
      values[i] = v;
    }
    return { shape: raw.shape, values };
  }
  const b = aligned(raw.bytes!);
  if (raw.dtype === "int32") {
    values.set(new Int32Array(b.buffer, b.byteOffset, n));
    return { shape: raw.shape, values };
  }
  const big = new BigInt64Array(b.buffer, b.byteOffset, n);
  for (let i = 0; i < n; i++) {
    const v = big[i];
    if (v < -2147483648n || v > 2147483647n) throw outOfRange(i, v);
    values[i] = Number(v);
  }
  return { shape: raw.shape, values };
}
