/**
 * The client's side of the forward call's wire formats: a JSON forward body
 * ({@link ForwardBody}, the request schema's input type) → the safetensors transport, and a
 * forward answer (JSON or safetensors) → typed arrays. The server's side is wire/codec.ts.
 * @module
 */
import { bytesPerElement, decode, encode } from "../core/dtype.ts";
import {
  parseSafetensors,
  type SafetensorsTensor,
  serializeSafetensors,
} from "../core/safetensors.ts";
import type { StorageDType } from "../core/types.ts";
import type { ForwardBody, ForwardResponse } from "./types.ts";
import {
  canonicalDtype,
  type JsonTensor,
  rawFromJson,
  safetensorsDtype,
  toIntTensor,
} from "./tensors.ts";

/** A JSON tensor or, for metadata, a plain (nested) array. */
export type TensorLike = ForwardBody["metadata"]["query_start_loc"];

/** A decoded forward answer. */
export interface ForwardAnswer {
  backend: string;
  /** [num_tokens, num_heads, head_size] */
  output: { dtype: string; shape: number[]; values: Float32Array };
  /** [num_heads, num_tokens] */
  lse?: { shape: number[]; values: Float32Array };
  timings?: Record<string, number>;
  /** The instance that answered (the `X-Attention-Instance` header), when it names itself. */
  instance?: string;
}

function tensorValues(
  t: { dtype: string; data?: (number | null)[]; base64?: string },
): Float32Array {
  if (t.data) return Float32Array.from(t.data, (x) => (x === null ? NaN : x));
  const bytes = Uint8Array.fromBase64(t.base64 ?? "");
  return decode(canonicalDtype(t.dtype) as StorageDType, bytes);
}

/**
 * A forward body the safetensors transport cannot carry as the JSON one would (an unknown field, a
 * non-integer or out-of-range metadata value, a malformed tensor): the client sends such a body as
 * JSON instead, so the server judges it the same way on both transports.
 */
export class Unrepresentable extends Error {
  constructor(what: string) {
    super(`not sent as safetensors: ${what}`);
    this.name = "Unrepresentable";
  }
}

const TENSOR_KEYS = ["dtype", "shape", "data", "base64"];
const METADATA_KEYS = ["query_start_loc", "seq_lens", "block_table", "slot_mapping"];
/**
 * The fields a binary forward's `__metadata__.request` carries (wire/request_schemas.ts
 * forwardCommon).
 */
const REQUEST_KEYS = [
  "backend",
  "dtype",
  "layer",
  "kv_cache",
  "kv_cache_layout",
  "return_lse",
  "output_encoding",
];
const FLOAT_TENSORS = ["query", "key", "value", "key_cache", "value_cache"];

/**
 * The body fields this codec knows, by where they sit: written out here so that a client need
 * not load the schemas (zod); tests/wire/client_keys_test.ts holds them to
 * wire/request_schemas.ts.
 */
export const CLIENT_BODY_KEYS: {
  readonly tensor: readonly string[];
  readonly metadata: readonly string[];
  readonly request: readonly string[];
  readonly float_tensors: readonly string[];
} = {
  tensor: TENSOR_KEYS,
  metadata: METADATA_KEYS,
  request: REQUEST_KEYS,
  float_tensors: FLOAT_TENSORS,
};

/**
 * The first number outside the tensors' `data` that JSON text cannot carry (NaN, +-Infinity: it
 * writes `null`, which for a layer field such as `scale`, `sliding_window` or
 * `logits_soft_cap` means "the default", so the call would run as if the field were absent), as
 * a path and the value; null when there is none.
 */
export function nonFiniteField(
  body: ForwardBody,
): { path: (string | number)[]; value: number } | null {
  const walk = (v: unknown, path: (string | number)[]): ReturnType<typeof nonFiniteField> => {
    if (typeof v === "number") return Number.isFinite(v) ? null : { path, value: v };
    if (typeof v !== "object" || v === null) return null;
    // Arrays by index (a prefill's slot_mapping holds thousands); integer typed arrays hold no
    // non-finite value.
    if (ArrayBuffer.isView(v)) {
      if (!(v instanceof Float32Array || v instanceof Float64Array)) return null;
      const i = v.findIndex((x) => !Number.isFinite(x));
      return i < 0 ? null : { path: [...path, i], value: v[i] };
    }
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        const x = v[i];
        if (typeof x === "number" && Number.isFinite(x)) continue;
        const hit = walk(x, [...path, i]);
        if (hit) return hit;
      }
      return null;
    }
    for (const [k, x] of Object.entries(v)) {
      // A tensor's data goes exactly either way (base64 where JSON would change it).
      if (k === "data" && path.length === 1 && FLOAT_TENSORS.includes(String(path[0]))) continue;
      const hit = walk(x, [...path, k]);
      if (hit) return hit;
    }
    return null;
  };
  return walk(body, []);
}
const FLOAT_DTYPES = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"];

function onlyKeys(o: object, keys: string[], where: string): void {
  const extra = Object.keys(o).filter((k) => !keys.includes(k));
  if (extra.length) throw new Unrepresentable(`${where} has unknown field(s) ${extra.join(", ")}`);
}

/**
 * A float tensor's bytes in its dtype: `data` numbers encoded (rounded as the server rounds JSON
 * numbers; NaN and infinities kept, so the server refuses them as it refuses such bytes), or its
 * `base64` decoded.
 */
function floatTensor(name: string, t: JsonTensor): SafetensorsTensor {
  if (typeof t !== "object" || t === null) throw new Unrepresentable(`${name} is not a tensor`);
  onlyKeys(t, TENSOR_KEYS, name);
  const dtype = canonicalDtype(String(t.dtype));
  if (!FLOAT_DTYPES.includes(dtype)) throw new Unrepresentable(`${name} dtype ${t.dtype}`);
  const shape = t.shape;
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new Unrepresentable(`${name} shape`);
  }
  const n = shape.reduce((a, d) => a * d, 1);
  const st = safetensorsDtype(dtype as StorageDType);
  if ((t.data === undefined) === (t.base64 === undefined)) {
    throw new Unrepresentable(`${name} needs exactly one of data or base64`);
  }
  if (t.data !== undefined) {
    if (
      !Array.isArray(t.data) || t.data.length !== n || !t.data.every((x) => typeof x === "number")
    ) {
      throw new Unrepresentable(`${name} data`);
    }
    return { dtype: st, shape, data: encode(dtype as StorageDType, t.data) };
  }
  let data: Uint8Array;
  try {
    data = Uint8Array.fromBase64(String(t.base64));
  } catch {
    throw new Unrepresentable(`${name} base64`);
  }
  if (data.byteLength !== n * bytesPerElement(dtype as StorageDType)) {
    throw new Unrepresentable(`${name} base64 length`);
  }
  return { dtype: st, shape, data };
}

/** A metadata tensor as the server reads it (its shape and int32 checks), as I32. */
function intTensor(name: string, t: TensorLike): SafetensorsTensor {
  if (!Array.isArray(t)) {
    if (typeof t !== "object" || t === null) throw new Unrepresentable(`${name} is not a tensor`);
    onlyKeys(t, TENSOR_KEYS, name);
  }
  try {
    const ints = toIntTensor(rawFromJson(t as JsonTensor | unknown[], [name]), [name]);
    return { dtype: "I32", shape: ints.shape, data: new Uint8Array(ints.values.buffer) };
  } catch (e) {
    throw new Unrepresentable(`${name}: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/**
 * Converts a JSON forward body to the safetensors transport.
 * @throws Unrepresentable when the body cannot go as safetensors the way it would go as JSON
 *   (the client then sends it as JSON).
 */
export function forwardBodyToSafetensors(body: ForwardBody): Uint8Array {
  const { query, key, value, key_cache, value_cache, metadata, ...rest } = body;
  onlyKeys(rest, REQUEST_KEYS, "the body");
  for (const k of FLOAT_TENSORS) {
    // null (untyped callers) is no tensor to drop: JSON sends it, for the server to name.
    if (body[k as keyof ForwardBody] === null) throw new Unrepresentable(`${k} null`);
  }
  const tensors: Record<string, SafetensorsTensor> = { query: floatTensor("query", query) };
  if (key) tensors.key = floatTensor("key", key);
  if (value) tensors.value = floatTensor("value", value);
  if (key_cache) tensors.key_cache = floatTensor("key_cache", key_cache);
  if (value_cache) tensors.value_cache = floatTensor("value_cache", value_cache);
  if (typeof metadata !== "object" || metadata === null) throw new Unrepresentable("metadata");
  onlyKeys(metadata, METADATA_KEYS, "metadata");
  for (const k of METADATA_KEYS as (keyof typeof metadata)[]) {
    const t = metadata[k];
    if (t !== undefined) tensors[k] = intTensor(k, t);
  }
  return serializeSafetensors(tensors, { request: JSON.stringify(rest) });
}

/** Whether JSON text carries every element of `data` as it is (finite, and no -0). */
const jsonExact = (data: unknown[]) =>
  data.every((x) => typeof x !== "number" || (Number.isFinite(x) && !Object.is(x, -0)));

/**
 * A forward body as the client sends it over JSON: a float tensor whose `data` JSON text would
 * change (NaN and infinities become null, -0 becomes 0) goes as `base64` of the same values, and
 * the answer is asked for in base64 (exact) unless the body says otherwise.
 */
export function jsonForwardBody(body: ForwardBody): ForwardBody {
  const out: ForwardBody = { ...body, output_encoding: body.output_encoding ?? "base64" };
  for (const k of ["query", "key", "value", "key_cache", "value_cache"] as const) {
    const t = body[k] as JsonTensor | undefined;
    if (!t || !Array.isArray(t.data) || jsonExact(t.data)) continue;
    try {
      const { data: _, ...meta } = t;
      const bytes = floatTensor(k, t).data;
      (out as Record<string, unknown>)[k] = { ...meta, base64: bytes.toBase64() };
    } catch { /* malformed: sent as it is, for the server to name */ }
  }
  return out;
}

/** A JSON forward answer → typed arrays. */
export function decodeJsonAnswer(r: ForwardResponse): ForwardAnswer {
  const ans: ForwardAnswer = {
    backend: r.backend,
    output: { dtype: r.output.dtype, shape: r.output.shape, values: tensorValues(r.output) },
    timings: r.timings,
  };
  if (r.lse) ans.lse = { shape: r.lse.shape, values: tensorValues(r.lse) };
  return ans;
}

/** A safetensors forward answer (`output`, `lse`; metadata backend, timings) → typed arrays. */
export function decodeSafetensorsAnswer(bytes: Uint8Array): ForwardAnswer {
  const file = parseSafetensors(bytes);
  const out = file.tensors.output;
  const dtype = canonicalDtype(out.dtype);
  const ans: ForwardAnswer = {
    backend: file.metadata.backend,
    output: { dtype, shape: out.shape, values: decode(dtype as StorageDType, out.data) },
    timings: file.metadata.timings ? JSON.parse(file.metadata.timings) : undefined,
  };
  if (file.tensors.lse) {
    ans.lse = { shape: file.tensors.lse.shape, values: decode("float32", file.tensors.lse.data) };
  }
  return ans;
}
