/**
 * The server's side of the forward call's wire formats: JSON bodies and safetensors bodies →
 * {@link ForwardInput} (the request schema's type with its tensors decoded); a
 * {@link ForwardOutcome} → a JSON or safetensors answer. The client's side (bodies to
 * safetensors, answers to typed arrays) is wire/client_codec.ts; cache files, wire/cache_file.ts.
 * @module
 */
import { encode } from "../core/dtype.ts";
import { type Issue, ServiceError } from "../core/errors.ts";
import { parseSafetensors, safetensorsParts, type SafetensorsTensor } from "../core/safetensors.ts";
import { type DuplicateKey, jsonPath, REPEATED_NAME } from "../core/json_structure.ts";
import { toFloat32 } from "../core/data.ts";
import type { DType, ForwardResult } from "../core/types.ts";
import {
  type CacheTensor,
  type DataTensor,
  type IntTensor,
  type JsonTensor,
  rawFromJson,
  rawFromSafetensors,
  type RawTensor,
  safetensorsDtype,
  toCacheTensor,
  toDataTensor,
  toIntTensor,
  toJsonTensor,
} from "./tensors.ts";
import type { z } from "zod";
import { scanJson, scanJsonText } from "./json_scan.ts";
import { fromZod } from "./zod_issues.ts";
import { rememberJsonText } from "./json_literals.ts";
import {
  BINARY_FORWARD_TENSORS,
  BinaryForwardRequestSchema,
  ForwardRequestSchema,
} from "./schemas.ts";
import type { ForwardRequest } from "./types.ts";

/** The fields of a forward request that carry tensors. */
type TensorFields = "query" | "key" | "value" | "key_cache" | "value_cache" | "metadata";

/**
 * A forward request with its tensors decoded (from JSON or safetensors): the ForwardRequest
 * schema's type, tensors typed by role, `output_encoding` taken out (it shapes the answer).
 */
export type ForwardInput = Omit<ForwardRequest, TensorFields | "output_encoding"> & {
  query: DataTensor;
  key?: DataTensor;
  value?: DataTensor;
  key_cache?: CacheTensor;
  value_cache?: CacheTensor;
  /** Each entry of the request's metadata, as an int32 tensor (same optionality). */
  metadata: { [K in keyof ForwardRequest["metadata"]]: IntTensor };
};

/** What a forward call produced, as the answer encoders take it (the service returns one). */
export interface ForwardOutcome {
  backend: string;
  result: ForwardResult;
  dtype: DType;
  num_tokens: number;
  num_heads: number;
  head_size: number;
}

/** A decoded forward request and how its JSON response should encode tensors. */
export interface DecodedForward {
  input: ForwardInput;
  encoding: "data" | "base64";
}

type Raws = Partial<Record<typeof BINARY_FORWARD_TENSORS[number], RawTensor>>;

function build(
  body: Omit<ForwardInput, TensorFields>,
  raws: Raws,
  paths: Record<string, (string | number)[]>,
): ForwardInput {
  const p = (k: keyof Raws) => paths[k] ?? [k];
  const opt = <T>(
    k: keyof Raws,
    f: (r: RawTensor, path: (string | number)[]) => T,
  ): T | undefined => raws[k] ? f(raws[k]!, p(k)) : undefined;
  return {
    ...body,
    query: toDataTensor(raws.query!, p("query")),
    key: opt("key", toDataTensor),
    value: opt("value", toDataTensor),
    key_cache: opt("key_cache", toCacheTensor),
    value_cache: opt("value_cache", toCacheTensor),
    metadata: {
      query_start_loc: toIntTensor(raws.query_start_loc!, p("query_start_loc")),
      seq_lens: toIntTensor(raws.seq_lens!, p("seq_lens")),
      block_table: opt("block_table", toIntTensor),
      slot_mapping: opt("slot_mapping", toIntTensor),
    },
  };
}

/**
 * A JSON forward body → ForwardInput.
 * @throws ServiceError 400 (schema, tensor encoding) or 422 (int64 out of int32 range).
 */
export function decodeJsonForward(body: unknown): DecodedForward {
  const r = ForwardRequestSchema.safeParse(body);
  if (!r.success) throw fromZod(r.error, body);
  const { query, key, value, key_cache, value_cache, metadata, output_encoding, ...rest } = r.data;
  const raws: Raws = {};
  const paths: Record<string, (string | number)[]> = {};
  const put = (k: keyof Raws, t: JsonTensor | unknown[] | undefined, path: (string | number)[]) => {
    if (t === undefined) return;
    paths[k] = path;
    raws[k] = rawFromJson(t, path, body);
  };
  put("query", query, ["query"]);
  put("key", key, ["key"]);
  put("value", value, ["value"]);
  put("key_cache", key_cache, ["key_cache"]);
  put("value_cache", value_cache, ["value_cache"]);
  for (const k of ["query_start_loc", "seq_lens", "block_table", "slot_mapping"] as const) {
    put(k, metadata[k], ["metadata", k]);
  }
  const input = build(rest, raws, paths);
  return { input, encoding: output_encoding ?? (query.base64 !== undefined ? "base64" : "data") };
}

/** The depth and size pre-scan of a safetensors header's JSON (400 / 413 from json_scan). */
function scanHeaderJson(header: Uint8Array): DuplicateKey | null {
  return scanJson(header, { what: "safetensors header" });
}

type BinaryRequest = z.output<typeof BinaryForwardRequestSchema>;

/**
 * `__metadata__.request` texts validated before, and what the schema made of them (frozen:
 * calls share them). An engine sends the same text on every call of a layer, so its JSON is
 * parsed and checked once; at most {@link REQUEST_MEMO_SIZE} texts of at most
 * {@link REQUEST_MEMO_TEXT} characters are kept (the oldest goes first), valid ones only.
 */
const requests = new Map<string, BinaryRequest>();
const REQUEST_MEMO_SIZE = 256;
const REQUEST_MEMO_TEXT = 16 * 1024;

function deepFreeze<T>(x: T): T {
  if (typeof x === "object" && x !== null && !Object.isFrozen(x)) {
    for (const v of Object.values(x)) deepFreeze(v);
    Object.freeze(x);
  }
  return x;
}

/**
 * `__metadata__.request` parsed and validated (400 naming the field and value when not).
 * @throws ServiceError 400 `invalid_request` (or json_scan's problems).
 */
function binaryRequest(text: string): BinaryRequest {
  const known = requests.get(text);
  if (known !== undefined) return known;
  const twice = scanJsonText(text, { what: "__metadata__.request" });
  let json: unknown;
  try {
    json = rememberJsonText(JSON.parse(text), text);
  } catch (e) {
    throw badRequest(
      `__metadata__.request is not valid JSON: ${e instanceof Error ? e.message : e}`,
      [
        { path: ["__metadata__", "request"], message: "not valid JSON" },
      ],
    );
  }
  if (twice) {
    const path = ["__metadata__", "request", ...twice.path];
    throw badRequest(
      `__metadata__.request: ${jsonPath(twice.path)} ${REPEATED_NAME}`,
      [{ path, message: REPEATED_NAME }],
    );
  }
  const r = BinaryForwardRequestSchema.safeParse(json);
  if (!r.success) {
    throw fromZod(r.error, json, {
      prefix: ["__metadata__", "request"],
      what: "__metadata__.request",
    });
  }
  if (text.length <= REQUEST_MEMO_TEXT) {
    if (requests.size >= REQUEST_MEMO_SIZE) requests.delete(requests.keys().next().value!);
    requests.set(text, deepFreeze(r.data));
  }
  return r.data;
}

function badRequest(message: string, issues?: Issue[]): ServiceError {
  return new ServiceError(message, { status: 400, code: "invalid_request", issues });
}

/**
 * A safetensors forward body → ForwardInput. The tensors go by name; `__metadata__.request`
 * holds the rest of the body as JSON.
 * @throws ServiceError 400 `bad_safetensors` / `invalid_request`, 422 for int64 overflow.
 */
export function decodeBinaryForward(bytes: Uint8Array): DecodedForward {
  const file = parseSafetensors(bytes, { scanHeader: scanHeaderJson });
  const text = file.metadata.request;
  if (text === undefined) {
    throw badRequest(
      "safetensors body needs __metadata__.request: the JSON of backend, dtype, layer, ...",
      [
        { path: ["__metadata__", "request"], message: "missing" },
      ],
    );
  }
  const request = binaryRequest(text);
  const unknown = Object.keys(file.tensors).filter((n) =>
    !(BINARY_FORWARD_TENSORS as readonly string[]).includes(n)
  );
  if (unknown.length) {
    throw badRequest(
      `unknown tensors ${unknown.join(", ")}; expected some of ${
        BINARY_FORWARD_TENSORS.join(", ")
      }`,
      unknown.map((n) => ({ path: [n], message: `unknown tensor ${n}` })),
    );
  }
  const missing = ["query", "query_start_loc", "seq_lens"].filter((n) => !file.tensors[n]);
  if (missing.length) {
    throw badRequest(
      `missing tensors: ${missing.join(", ")}`,
      missing.map((n) => ({ path: [n], message: "required" })),
    );
  }
  const raws: Raws = {};
  for (const [name, t] of Object.entries(file.tensors)) {
    raws[name as keyof Raws] = rawFromSafetensors(t);
  }
  const { output_encoding, ...rest } = request;
  return { input: build(rest, raws, {}), encoding: output_encoding ?? "base64" };
}

/** A forward outcome as the JSON response body (base64 of the output bytes as computed). */
export function forwardJson(
  o: ForwardOutcome,
  encoding: "data" | "base64",
): Record<string, unknown> {
  const shape = [o.num_tokens, o.num_heads, o.head_size];
  const out: Record<string, unknown> = {
    backend: o.backend,
    output: encoding === "base64"
      ? { dtype: o.dtype, shape, base64: o.result.output.bytes.toBase64() }
      : toJsonTensor(o.dtype, shape, toFloat32(o.result.output), "data"),
  };
  if (o.result.lse) {
    out.lse = toJsonTensor("float32", [o.num_heads, o.num_tokens], o.result.lse, encoding);
  }
  if (o.result.timings) out.timings = o.result.timings;
  return out;
}

/**
 * A forward outcome as a safetensors file in parts (`output`, `lse`; metadata backend and
 * timings): the output's bytes go out as the backend produced them, uncopied.
 */
export function forwardSafetensors(o: ForwardOutcome): Uint8Array[] {
  const tensors: Record<string, SafetensorsTensor> = {
    output: {
      dtype: safetensorsDtype(o.dtype),
      shape: [o.num_tokens, o.num_heads, o.head_size],
      data: o.result.output.bytes,
    },
  };
  if (o.result.lse) {
    tensors.lse = {
      dtype: "F32",
      shape: [o.num_heads, o.num_tokens],
      data: encode("float32", o.result.lse),
    };
  }
  return safetensorsParts(tensors, {
    backend: o.backend,
    timings: JSON.stringify(o.result.timings ?? {}),
  });
}
