/**
 * The safetensors format's vocabulary: the dtypes this service reads and writes and their
 * element sizes, the tensor and file shapes that core/safetensors_parse.ts yields and
 * core/safetensors_write.ts takes, the element count of a shape, and how a value is shown in a
 * defect's message.
 * @module
 */
/** The safetensors dtypes this service reads and writes. */
export const SAFETENSORS_DTYPES = [
  "F32",
  "F16",
  "BF16",
  "F8_E4M3",
  "F8_E5M2",
  "I32",
  "I64",
] as const;
/** One supported safetensors dtype name. */
export type SafetensorsDType = typeof SAFETENSORS_DTYPES[number];

/** Bytes per element of each supported safetensors dtype. */
export const SAFETENSORS_DTYPE_BYTES: Record<SafetensorsDType, number> = {
  F32: 4,
  F16: 2,
  BF16: 2,
  F8_E4M3: 1,
  F8_E5M2: 1,
  I32: 4,
  I64: 8,
};

/** One tensor: dtype, shape and its raw little-endian bytes (a view into the file when parsed). */
export interface SafetensorsTensor {
  dtype: SafetensorsDType;
  shape: number[];
  data: Uint8Array;
}

/** A parsed (or to-be-written) safetensors file. */
export interface SafetensorsFile {
  /** Tensors by name, in file (offset) order when parsed. */
  tensors: Record<string, SafetensorsTensor>;
  /** The `__metadata__` string map ({} when absent). */
  metadata: Record<string, string>;
}

/** A value as a defect message names it: JSON, cut to 60 characters. */
export function show(v: unknown): string {
  if (v === undefined) return "undefined (missing)";
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 60 ? s.slice(0, 57) + "..." : s;
}

/** Number of elements of a shape (1 for a scalar `[]`). */
export function numel(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}
