/**
 * A typed fetch-based client of the attention service. Errors come back as
 * {@link AttentionApiError} carrying the server's RFC 9457 problem document.
 * @module
 */
import { decode, encode } from "../core/dtype.ts";
import {
  parseSafetensors,
  type SafetensorsTensor,
  serializeSafetensors,
} from "../core/safetensors.ts";
import { canonicalDtype, type JsonTensor, safetensorsDtype } from "../wire/tensors.ts";
import type { DeviceReport, SelectorConfig, StorageDType } from "../core/types.ts";
import type { ProblemDocument } from "../server/problem.ts";
import type { CacheInfo, CreateCacheRequest, SelectResult } from "../service/service.ts";

/** A failed call: the HTTP status and the problem document. */
export class AttentionApiError extends Error {
  readonly status: number;
  readonly problem: ProblemDocument;
  constructor(status: number, problem: ProblemDocument) {
    super(
      `${status} ${problem.code ?? ""}: ${problem.detail ?? problem.title ?? "request failed"}`,
    );
    this.name = "AttentionApiError";
    this.status = status;
    this.problem = problem;
  }
  /** The problem's machine code. */
  get code(): string {
    return this.problem.code;
  }
}

/** A JSON tensor or, for metadata, a plain (nested) array. */
export type TensorLike = JsonTensor | number[] | number[][];

/** A forward request as JSON (the contract's body). */
export interface ForwardBody {
  backend?: string;
  dtype: "float32" | "float16" | "bfloat16";
  layer: Record<string, unknown> & { num_heads: number; num_kv_heads: number; head_size: number };
  query: JsonTensor;
  key?: JsonTensor;
  value?: JsonTensor;
  metadata: {
    query_start_loc: TensorLike;
    seq_lens: TensorLike;
    block_table?: TensorLike;
    slot_mapping?: TensorLike;
  };
  kv_cache?: string;
  key_cache?: JsonTensor;
  value_cache?: JsonTensor;
  kv_cache_layout?: "NHD" | "HND";
  return_lse?: boolean;
  output_encoding?: "data" | "base64";
}

/** A decoded forward answer. */
export interface ForwardAnswer {
  backend: string;
  /** [num_tokens, num_heads, head_size] */
  output: { dtype: string; shape: number[]; values: Float32Array };
  /** [num_heads, num_tokens] */
  lse?: { shape: number[]; values: Float32Array };
  timings?: Record<string, number>;
}

/** A cache's contents. */
export interface CacheContents {
  key_cache: SafetensorsTensor;
  value_cache: SafetensorsTensor;
  metadata: Record<string, string>;
}

function tensorValues(
  t: { dtype: string; data?: (number | null)[]; base64?: string },
): Float32Array {
  if (t.data) return Float32Array.from(t.data, (x) => (x === null ? NaN : x));
  const bytes = Uint8Array.fromBase64(t.base64 ?? "");
  return decodeBytes(canonicalDtype(t.dtype) as StorageDType, bytes);
}

function decodeBytes(dtype: StorageDType, bytes: Uint8Array): Float32Array {
  return decode(dtype, bytes);
}

function intTensor(name: string, t: TensorLike): SafetensorsTensor {
  if (Array.isArray(t)) {
    const rows = t.every(Array.isArray) ? (t as number[][]) : null;
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

/** Options of a client. */
export interface ClientOptions {
  /** A fetch implementation (default globalThis.fetch). */
  fetch?: typeof fetch;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
}

/** A typed client of the attention service. */
export class AttentionClient {
  readonly baseUrl: string;
  #fetch: typeof fetch;
  #headers: Record<string, string>;

  /** @param baseUrl e.g. `http://127.0.0.1:8000` */
  constructor(baseUrl: string, opts: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.#headers = opts.headers ?? {};
  }

  async #call(
    method: string,
    path: string,
    init: { json?: unknown; body?: Uint8Array; accept?: string } = {},
  ) {
    const headers: Record<string, string> = { ...this.#headers };
    let body: BodyInit | undefined;
    if (init.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(init.json);
    } else if (init.body) {
      headers["content-type"] = "application/octet-stream";
      body = init.body as Uint8Array<ArrayBuffer>;
    }
    if (init.accept) headers.accept = init.accept;
    const res = await this.#fetch(`${this.baseUrl}${path}`, { method, headers, body });
    if (!res.ok) {
      const text = await res.text();
      let doc: ProblemDocument;
      try {
        doc = JSON.parse(text);
      } catch {
        doc = {
          type: "about:blank",
          title: res.statusText,
          status: res.status,
          detail: text,
          code: "http_error",
        };
      }
      throw new AttentionApiError(res.status, doc);
    }
    return res;
  }

  async #json<T>(method: string, path: string, json?: unknown): Promise<T> {
    return await (await this.#call(method, path, { json })).json() as T;
  }

  /** `GET /healthz`. */
  health(): Promise<{ status: "ok" }> {
    return this.#json("GET", "/healthz");
  }
  /** `GET /v1/device`. */
  device(): Promise<DeviceReport> {
    return this.#json("GET", "/v1/device");
  }
  /** `GET /v1/backends`. */
  async backends(): Promise<Record<string, unknown>[]> {
    return (await this.#json<{ backends: Record<string, unknown>[] }>("GET", "/v1/backends"))
      .backends;
  }
  /** `POST /v1/backends/select`. */
  select(
    cfg: Partial<SelectorConfig> & { head_size: number; dtype: string; backend?: string },
  ): Promise<SelectResult> {
    return this.#json("POST", "/v1/backends/select", cfg);
  }
  /** `POST /v1/kv-caches`. */
  createCache(req: CreateCacheRequest): Promise<CacheInfo> {
    return this.#json("POST", "/v1/kv-caches", req);
  }
  /** `GET /v1/kv-caches/{id}`. */
  getCache(id: string): Promise<CacheInfo> {
    return this.#json("GET", `/v1/kv-caches/${encodeURIComponent(id)}`);
  }
  /** `GET /v1/kv-caches/{id}/data`, parsed. */
  async cacheData(id: string): Promise<CacheContents> {
    const res = await this.#call("GET", `/v1/kv-caches/${encodeURIComponent(id)}/data`);
    const file = parseSafetensors(new Uint8Array(await res.arrayBuffer()));
    return {
      key_cache: file.tensors.key_cache,
      value_cache: file.tensors.value_cache,
      metadata: file.metadata,
    };
  }
  /** `DELETE /v1/kv-caches/{id}`. */
  async deleteCache(id: string): Promise<void> {
    await (await this.#call("DELETE", `/v1/kv-caches/${encodeURIComponent(id)}`)).body?.cancel();
  }

  /**
   * `POST /v1/attention/forward`. `binary: true` sends the body as safetensors and asks for a
   * safetensors answer; either way the answer is decoded to typed arrays.
   */
  async forward(body: ForwardBody, opts: { binary?: boolean } = {}): Promise<ForwardAnswer> {
    if (opts.binary) {
      const res = await this.#call("POST", "/v1/attention/forward", {
        body: forwardBodyToSafetensors(body),
        accept: "application/octet-stream",
      });
      const file = parseSafetensors(new Uint8Array(await res.arrayBuffer()));
      const out = file.tensors.output;
      const ans: ForwardAnswer = {
        backend: file.metadata.backend,
        output: {
          dtype: canonicalDtype(out.dtype),
          shape: out.shape,
          values: decodeBytes(canonicalDtype(out.dtype) as StorageDType, out.data),
        },
        timings: file.metadata.timings ? JSON.parse(file.metadata.timings) : undefined,
      };
      if (file.tensors.lse) {
        ans.lse = {
          shape: file.tensors.lse.shape,
          values: decodeBytes("float32", file.tensors.lse.data),
        };
      }
      return ans;
    }
    const r = await this.#json<{
      backend: string;
      output: JsonTensor;
      lse?: JsonTensor;
      timings?: Record<string, number>;
    }>("POST", "/v1/attention/forward", body);
    const ans: ForwardAnswer = {
      backend: r.backend,
      output: { dtype: r.output.dtype, shape: r.output.shape, values: tensorValues(r.output) },
      timings: r.timings,
    };
    if (r.lse) ans.lse = { shape: r.lse.shape, values: tensorValues(r.lse) };
    return ans;
  }
}
