/**
 * A typed fetch-based client of the attention service: {@link AttentionClient}, one method per
 * route. Request and answer types come from the wire contract (wire/types.ts, inferred from the
 * zod schemas the server validates with); encoding and decoding from wire/client_codec.ts and
 * wire/cache_file.ts; reading an answer from client/answer_read.ts; the calls refused before
 * sending from client/client_refusals.ts; its option and result types from
 * client/client_options.ts (all re-exported here). Nothing here comes from server/ or service/
 * (tests/client/imports_test.ts checks). Errors come back as {@link AttentionApiError} carrying
 * the server's RFC 9457 problem document, or the client's own: `network_error` (status 0) when no
 * answer came or its body broke off, `bad_response` when a successful answer cannot be decoded; a
 * caller's abort rejects with the signal's reason.
 * @module
 */
import {
  type CacheData,
  cacheFileBytes,
  cacheSafetensors,
  createRequestOf,
  parseCacheFile,
} from "../wire/cache_file.ts";
import {
  decodeJsonAnswer,
  decodeSafetensorsAnswer,
  type ForwardAnswer,
  forwardBodyToSafetensors,
  jsonForwardBody,
  Unrepresentable,
} from "../wire/client_codec.ts";
import {
  CACHE_ID_PATTERN,
  CACHE_ID_RULE,
  INSTANCE_HEADER,
  QUEUE_TIMEOUT_HEADER,
} from "../wire/names.ts";
import { AttentionApiError, networkError, problemOf, retryAfterOf } from "./api_error.ts";
import {
  answer,
  isJsonAnswer,
  parseJson,
  readBody,
  readBytes,
  readText,
  withInstance,
} from "./answer_read.ts";
import type {
  CacheContents,
  ClientOptions,
  ForwardOptions,
  PutCacheResult,
} from "./client_options.ts";
import { queueTimeoutText, refuseNonFinite } from "./client_refusals.ts";
import type {
  BackendDescription,
  CacheInfo,
  CreateCacheRequest,
  DeviceInfo,
  ForwardBody,
  ForwardResponse,
  HealthResponse,
  ProblemDocument,
  SelectRequest,
  SelectResult,
} from "../wire/types.ts";

export type { CacheData, ForwardAnswer, ForwardBody, ProblemDocument };
export type { CacheContents, ClientOptions, ForwardOptions, PutCacheResult };
export { AttentionApiError };
export { createRequestOf, forwardBodyToSafetensors };

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
    init: {
      json?: unknown;
      body?: Uint8Array;
      accept?: string;
      signal?: AbortSignal;
      headers?: Record<string, string>;
    } = {},
  ) {
    // Names match in any case: the body's type and the Accept a call decodes replace the
    // caller's own (a plain object kept both `Accept` and `accept`, sent joined).
    const headers = new Headers(this.#headers);
    for (const [k, v] of Object.entries(init.headers ?? {})) headers.set(k, v);
    let body: BodyInit | undefined;
    if (init.json !== undefined) {
      headers.set("content-type", "application/json");
      body = JSON.stringify(init.json);
    } else if (init.body) {
      headers.set("content-type", "application/octet-stream");
      body = init.body as Uint8Array<ArrayBuffer>;
    }
    // What the call decodes: JSON unless it says otherwise (a caller's Accept would not fit it).
    headers.set("accept", init.accept ?? "application/json");
    const url = `${this.baseUrl}${path}`;
    let res: Response;
    try {
      res = await this.#fetch(url, { method, headers, body, signal: init.signal });
    } catch (e) {
      throw init.signal?.aborted ? e : networkError(e, `${method} ${url} got no answer`);
    }
    if (!res.ok) {
      const doc = problemOf(res, await readBody(res, readText, init.signal));
      const instance = res.headers.get(INSTANCE_HEADER) ?? undefined;
      throw new AttentionApiError(res.status, doc, instance, retryAfterOf(res));
    }
    return res;
  }

  async #json<T>(method: string, path: string, json?: unknown): Promise<T> {
    return await answer(await this.#call(method, path, { json }), readText, parseJson<T>);
  }

  /**
   * The path of a cache. An id outside the rule is refused here with the problem the server
   * gives (400 `invalid_cache_id`): sent, `.` or `..` would be resolved into another path.
   */
  #cache(id: string, tail = ""): string {
    if (typeof id !== "string" || !CACHE_ID_PATTERN.test(id)) {
      const got = JSON.stringify(id) ?? String(id);
      throw new AttentionApiError(400, {
        type: "urn:attn-service:problem:invalid_cache_id",
        title: "Bad Request",
        status: 400,
        detail:
          `path parameter id ${got} is not a cache id: ${CACHE_ID_RULE} (refused by the client)`,
        code: "invalid_cache_id",
        issues: [{ path: ["id"], message: `must be ${CACHE_ID_RULE}; got ${got}` }],
      });
    }
    return `/v1/kv-caches/${id}${tail}`;
  }

  /** `GET /healthz`. */
  health(): Promise<HealthResponse> {
    return this.#json("GET", "/healthz");
  }
  /** `GET /v1/device`. */
  device(): Promise<DeviceInfo> {
    return this.#json("GET", "/v1/device");
  }
  /** `GET /v1/backends`. */
  async backends(): Promise<BackendDescription[]> {
    return (await this.#json<{ backends: BackendDescription[] }>("GET", "/v1/backends")).backends;
  }
  /** `POST /v1/backends/select`. */
  select(cfg: SelectRequest): Promise<SelectResult> {
    return this.#json("POST", "/v1/backends/select", cfg);
  }
  /** `POST /v1/kv-caches`: a cache whose id the server chooses. */
  createCache(req: CreateCacheRequest): Promise<CacheInfo> {
    return this.#json("POST", "/v1/kv-caches", req);
  }
  /**
   * `PUT /v1/kv-caches/{id}`: the cache `id`, created (201) or found with the same spec (200);
   * another spec is a 409 `cache_conflict`.
   */
  async putCache(id: string, req: CreateCacheRequest): Promise<PutCacheResult> {
    const res = await this.#call("PUT", this.#cache(id), { json: req });
    const out: PutCacheResult = {
      info: await answer(res, readText, parseJson<CacheInfo>),
      created: res.status === 201,
    };
    const instance = res.headers.get(INSTANCE_HEADER);
    if (instance !== null) out.instance = instance;
    return out;
  }
  /** `GET /v1/kv-caches/{id}`. */
  async getCache(id: string): Promise<CacheInfo> {
    return await this.#json("GET", this.#cache(id));
  }
  /** `GET /v1/kv-caches/{id}/data`, parsed. */
  async cacheData(id: string): Promise<CacheContents> {
    const res = await this.#call("GET", this.#cache(id, "/data"), {
      accept: "application/octet-stream",
    });
    return await answer(res, readBytes, parseCacheFile);
  }
  /**
   * `PUT /v1/kv-caches/{id}/data`: replaces the cache's contents with a cache file: the bytes of
   * a `GET .../data`, what {@link cacheData} returned (so a cache moves in two calls), or
   * {@link CacheData} to encode.
   */
  async putCacheData(id: string, data: Uint8Array | CacheContents | CacheData): Promise<CacheInfo> {
    const body = data instanceof Uint8Array
      ? data
      : "key_cache" in data
      ? cacheFileBytes(data)
      : cacheSafetensors(data);
    const res = await this.#call("PUT", this.#cache(id, "/data"), { body });
    return await answer(res, readText, parseJson<CacheInfo>);
  }
  /** `DELETE /v1/kv-caches/{id}`. */
  async deleteCache(id: string): Promise<void> {
    await (await this.#call("DELETE", this.#cache(id))).body?.cancel();
  }

  /**
   * `POST /v1/attention/forward` (the body may name a server-held cache in `kv_cache`).
   * `binary: true` sends the body as safetensors and asks for a safetensors answer; either way
   * the answer is decoded to typed arrays.
   */
  forward(body: ForwardBody, opts: ForwardOptions = {}): Promise<ForwardAnswer> {
    return this.#forward("/v1/attention/forward", body, opts);
  }

  /**
   * `POST /v1/kv-caches/{id}/forward`: a forward call on the server-held cache `id` (the route
   * a proxy can send to the instance holding it). The body names no `kv_cache`.
   */
  async forwardOn(
    id: string,
    body: ForwardBody,
    opts: ForwardOptions = {},
  ): Promise<ForwardAnswer> {
    return await this.#forward(this.#cache(id, "/forward"), body, opts);
  }

  /**
   * Sends a forward body: as safetensors when asked and it can go so as it would go as JSON
   * (else as JSON, for the server to judge: wire/client_codec.ts Unrepresentable), or as JSON
   * (values JSON text would change go as base64; the answer comes in base64).
   */
  async #forward(path: string, body: ForwardBody, opts: ForwardOptions) {
    const { signal } = opts;
    refuseNonFinite(body);
    const headers = opts.queueTimeoutMs === undefined
      ? undefined
      : { [QUEUE_TIMEOUT_HEADER]: queueTimeoutText(opts.queueTimeoutMs) };
    let bytes: Uint8Array | null = null;
    if (opts.binary) {
      try {
        bytes = forwardBodyToSafetensors(body);
      } catch (e) {
        if (!(e instanceof Unrepresentable)) throw e;
      }
    }
    if (bytes) {
      const accept = "application/octet-stream";
      const res = await this.#call("POST", path, { body: bytes, accept, signal, headers });
      // A JSON answer (a proxy's rewrite of Accept) is decoded as such: the call ran.
      if (!isJsonAnswer(res)) {
        return withInstance(res, await answer(res, readBytes, decodeSafetensorsAnswer, signal));
      }
      const decode = (t: string) => decodeJsonAnswer(parseJson<ForwardResponse>(t));
      return withInstance(res, await answer(res, readText, decode, signal));
    }
    const res = await this.#call("POST", path, { json: jsonForwardBody(body), signal, headers });
    const decode = (t: string) => decodeJsonAnswer(parseJson<ForwardResponse>(t));
    return withInstance(res, await answer(res, readText, decode, signal));
  }
}
