/**
 * The client's side of the forward call's wire formats: a JSON forward body
 * ({@link ForwardBody}, the request schema's input type) → the safetensors transport, and a
 * forward answer (JSON or safetensors) → typed arrays. The server's side is wire/codec.ts.
 * @module
 */
import { decode, encode } from "../core/dtype.ts";
import {
  parseSafetensors,
  type SafetensorsTensor,
  serializeSafetensors,
} from "../core/safetensors.ts";
import type { StorageDType } from "../core/types.ts";
import type { ForwardBody, ForwardResponse } from "./types.ts";
import { canonicalDtype, type JsonTensor, safetensorsDtype } from "./tensors.ts";

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

function intTensor(name: string, t: TensorLike): SafetensorsTensor {
  if (Array.isArray(t)) {
    // An empty array is 1-D ([0]), as the server reads it in JSON: slot_mapping of a step with
    // no new tokens.
    const rows = t.length > 0 && t.every(Array.isArray) ? (t as number[][]) : null;
    const flat = rows ? rows.flat() : (t as number[]);
    const shape = rows ? [rows.length, rows[0]?.length ?? 0] : [flat.length];
    return { dtype: "I32", shape, data: new Uint8Array(Int32Array.from(flat).buffer) };
  }
  return jsonToSafetensors(name, t);
}

function jsonToSafetensors(name: string, t: JsonTensor): SafetensorsTensor {
  const c = canonicalDtype(t.dtype) as StorageDType | "int32" | "int64";
  const dtype = safetensorsDtype(c);
  if (t.base64 !== undefined) {
    return { dtype, shape: t.shape, data: Uint8Array.fromBase64(t.base64) };
  }
  if (!t.data) throw new Error(`tensor ${name} has neither data nor base64`);
  if (c === "int32") {
    return { dtype, shape: t.shape, data: new Uint8Array(Int32Array.from(t.data).buffer) };
  }
  if (c === "int64") {
    return {
      dtype,
      shape: t.shape,
      data: new Uint8Array(BigInt64Array.from(t.data, (x) => BigInt(x)).buffer),
    };
  }
  return { dtype, shape: t.shape, data: encode(c, t.data) };
}

/** Converts a JSON forward body to the safetensors transport. */
export function forwardBodyToSafetensors(body: ForwardBody): Uint8Array {
  const { query, key, value, key_cache, value_cache, metadata, ...rest } = body;
  const tensors: Record<string, SafetensorsTensor> = { query: jsonToSafetensors("query", query) };
  if (key) tensors.key = jsonToSafetensors("key", key);
  if (value) tensors.value = jsonToSafetensors("value", value);
  if (key_cache) tensors.key_cache = jsonToSafetensors("key_cache", key_cache);
  if (value_cache) tensors.value_cache = jsonToSafetensors("value_cache", value_cache);
  for (const k of ["query_start_loc", "seq_lens", "block_table", "slot_mapping"] as const) {
    const t = metadata[k];
    if (t !== undefined) tensors[k] = intTensor(k, t);
  }
  return serializeSafetensors(tensors, { request: JSON.stringify(rest) });
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
