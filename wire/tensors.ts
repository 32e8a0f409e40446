/**
 * Tensors as requests carry them, turned into typed host arrays by role:
 * - data tensors (query/key/value): {@link DataArray}s of their dtype (bytes as they came, or
 *   JSON numbers rounded and encoded); finiteness is checked by validation (422);
 * - cache tensors (key_cache/value_cache): raw little-endian bytes in their storage dtype;
 * - int tensors (metadata): Int32Array (int64 values must fit in int32).
 *
 * A tensor arrives as JSON `{dtype, shape, data: [numbers]}`, JSON `{dtype, shape, base64}`
 * (raw LE bytes), a plain (nested) JSON array (metadata only), or a safetensors entry. Every
 * defect is a ServiceError naming the tensor's path (400, or 422 for int64 values outside
 * the int32 range).
 *
 * This module reads the wire forms into a {@link RawTensor} and writes JSON tensors. The role
 * decoders (toDataTensor, toCacheTensor, toIntTensor) and their tensor types live in
 * wire/tensor_roles.ts and are re-exported here; the path-naming error both use is in
 * wire/tensor_error.ts.
 * @module
 */
import { encode, SAFETENSORS_DTYPE } from "../core/dtype.ts";
import { numel, type SafetensorsDType, type SafetensorsTensor } from "../core/safetensors.ts";
import type { StorageDType } from "../core/types.ts";
import { fail, type Path, show } from "./tensor_error.ts";
import { literalAt } from "./json_literals.ts";

export type { CacheTensor, DataTensor, IntTensor } from "./tensor_roles.ts";
export { toCacheTensor, toDataTensor, toIntTensor } from "./tensor_roles.ts";

/** A tensor as JSON carries it. */
export interface JsonTensor {
  dtype: string;
  shape: number[];
  data?: number[];
  base64?: string;
}

/** How a tensor was encoded on the wire. */
export type TensorEncoding = "data" | "base64" | "array" | "binary";

/** A tensor before role-specific decoding: JSON numbers or raw bytes, dtype canonicalised. */
export interface RawTensor {
  /** Canonical dtype name (float32, float16, bfloat16, fp8_e4m3, fp8_e5m2, int32, int64). */
  dtype: string;
  shape: number[];
  numbers?: ArrayLike<number>;
  bytes?: Uint8Array;
  encoding: TensorEncoding;
  /**
   * JSON only, when the body's text is known: the literal the client wrote at a path (from the
   * body's root) where float64 changed the number (`9007199254740993`, `1e400`), for messages.
   */
  literal?: (path: Path) => string | undefined;
}

const ALIASES: Record<string, string> = Object.fromEntries(
  Object.entries(SAFETENSORS_DTYPE).map(([name, st]) => [st, name]),
);
const BYTES: Record<string, number> = {
  float32: 4,
  float16: 2,
  bfloat16: 2,
  fp8_e4m3: 1,
  fp8_e5m2: 1,
  int32: 4,
  int64: 8,
};

/** Canonical name of a dtype, accepting safetensors names (F16 → float16); unknown names pass through. */
export function canonicalDtype(name: string): string {
  return ALIASES[name] ?? name;
}

/** The safetensors name of a canonical dtype. */
export function safetensorsDtype(name: StorageDType | "int32" | "int64"): SafetensorsDType {
  return SAFETENSORS_DTYPE[name] as SafetensorsDType;
}

function flatten(a: unknown[], path: Path): { shape: number[]; numbers: number[] } {
  const shape: number[] = [];
  let level: unknown = a;
  while (Array.isArray(level)) {
    shape.push(level.length);
    level = level[0];
  }
  const numbers: number[] = [];
  const walk = (x: unknown, depth: number, at: Path): void => {
    if (depth === shape.length) {
      // A JSON number beyond float64 (1e400) parses as +-Infinity: an integer out of range,
      // which toIntTensor refuses as such (422), as it does 1e10.
      if (typeof x !== "number" || Number.isNaN(x)) {
        throw fail(at, `expected a number, got ${show(x)}`);
      }
      numbers.push(x);
      return;
    }
    if (!Array.isArray(x) || x.length !== shape[depth]) {
      throw fail(
        at,
        `ragged array: expected ${shape[depth]} entries at depth ${depth}, got ${show(x)}`,
      );
    }
    for (let i = 0; i < x.length; i++) walk(x[i], depth + 1, [...at, i]);
  };
  walk(a, 0, path);
  return { shape, numbers };
}

/**
 * A JSON tensor (or plain nested array) → RawTensor; checks shape, element count and base64.
 * `root`: the parsed body `path` starts from, whose literals messages then quote
 * (wire/json_literals.ts).
 */
export function rawFromJson(t: JsonTensor | unknown[], path: Path, root?: unknown): RawTensor {
  const literal = root === undefined ? undefined : (at: Path) => literalAt(root, at);
  if (Array.isArray(t)) {
    const { shape, numbers } = flatten(t, path);
    return { dtype: "int64", shape, numbers, encoding: "array", literal };
  }
  const dtype = canonicalDtype(t.dtype);
  if (!(dtype in BYTES)) {
    throw fail([...path, "dtype"], `unknown dtype ${show(t.dtype)}`);
  }
  if (!Array.isArray(t.shape) || !t.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw fail([...path, "shape"], `shape must be non-negative integers, got ${show(t.shape)}`);
  }
  const n = numel(t.shape);
  if ((t.data === undefined) === (t.base64 === undefined)) {
    throw fail(path, "give exactly one of data or base64");
  }
  if (t.data !== undefined) {
    if (t.data.length !== n) {
      throw fail(
        [...path, "data"],
        `has ${t.data.length} elements but shape ${show(t.shape)} needs ${n}`,
      );
    }
    for (let i = 0; i < t.data.length; i++) {
      if (typeof t.data[i] !== "number" || Number.isNaN(t.data[i])) {
        throw fail([...path, "data", i], `expected a number, got ${show(t.data[i])}`);
      }
    }
    return { dtype, shape: t.shape, numbers: t.data, encoding: "data", literal };
  }
  const text = t.base64!;
  // RFC 4648 strictly: fromBase64 itself skips ASCII whitespace anywhere and, "loose", takes a
  // last chunk without its padding or with nonzero pad bits, so a corrupted string decoded to the
  // bytes of a good one (session 38's audit).
  const stray = text.search(/[^A-Za-z0-9+/=]/);
  if (stray >= 0) {
    throw fail(
      [...path, "base64"],
      `character ${stray} is ${JSON.stringify(text[stray])}: base64 here is RFC 4648's alphabet ` +
        "(A-Z a-z 0-9 + /) with = padding, no whitespace",
      "bad_base64",
    );
  }
  let bytes: Uint8Array;
  try {
    bytes = Uint8Array.fromBase64(text, { lastChunkHandling: "strict" });
  } catch (e) {
    throw fail(
      [...path, "base64"],
      `not valid base64 (${e instanceof Error ? e.message : String(e)})`,
      "bad_base64",
    );
  }
  const want = n * BYTES[dtype];
  if (bytes.byteLength !== want) {
    throw fail(
      [...path, "base64"],
      `decodes to ${bytes.byteLength} bytes but ${dtype} x ${show(t.shape)} needs ${want}`,
    );
  }
  return { dtype, shape: t.shape, bytes, encoding: "base64" };
}

/** A safetensors entry → RawTensor (its bytes are used as they are). */
export function rawFromSafetensors(t: SafetensorsTensor): RawTensor {
  return { dtype: canonicalDtype(t.dtype), shape: t.shape, bytes: t.data, encoding: "binary" };
}

/** Encodes values as a JSON tensor: `data` numbers or `base64` of the dtype's LE bytes. */
export function toJsonTensor(
  dtype: StorageDType,
  shape: number[],
  values: Float32Array,
  encoding: "data" | "base64",
): JsonTensor {
  if (encoding === "base64") return { dtype, shape, base64: encode(dtype, values).toBase64() };
  return { dtype, shape, data: Array.from(values) };
}
