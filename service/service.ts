/**
 * The attention service: backends (through the registry), the device, server-held caches and
 * the forward call, independent of HTTP. There is no global lock: forwards run concurrently,
 * and only work on the same server-held cache is serialised (by that cache's mutex).
 * A rejected call changes no cache: everything is validated before a backend writes.
 * The forward call itself runs in forward.ts.
 * @module
 */
import { resolveStorage } from "../core/dtype.ts";
import { checkCacheSpec } from "../core/cache_spec.ts";
import { DeviceUnavailableError } from "../core/errors.ts";
import { checkServiceEnv } from "./service_env.ts";
import type {
  AttentionBackend,
  BackendContext,
  DeviceProvider,
  DeviceReport,
  KvCacheSpec,
  SelectorConfig,
} from "../core/types.ts";
import { BackendRegistry, selectorConfigDefaults } from "../backends/registry.ts";
import { CacheStore, type StoredCache } from "./cache_store.ts";
import { type CallLimits, DEFAULT_CALL_LIMITS, type ForwardInput } from "./validate.ts";
import { PlanCache } from "./plan_cache.ts";
import { type CacheData, type CacheFile, cacheShape, checkCacheFile } from "../wire/cache_file.ts";
import { requireSameSpec, specOf } from "./cache_spec.ts";
import type { ForwardOutcome } from "../wire/codec.ts";
import type { CacheInfo, CreateCacheRequest, SelectResult } from "../wire/types.ts";
import { type ForwardHost, type ForwardOptions, runForward } from "./forward.ts";
import { forced } from "./forced_backend.ts";
import { cacheLost } from "./cache_lost.ts";

/** Options of {@link AttentionService}. */
export interface AttentionServiceOptions {
  backends: AttentionBackend[];
  device: DeviceProvider;
  /** Total bytes all server-held caches (and inline caches while a call uses them) may hold. */
  memoryBudgetBytes: number;
  /** Per-call limits (default {@link DEFAULT_CALL_LIMITS}). */
  limits?: Partial<CallLimits>;
  /** Most plans kept (default 256). */
  planCacheSize?: number;
}

export type { ForwardOptions };

export type { CacheData, CacheInfo, CreateCacheRequest, ForwardOutcome, SelectResult };
export { cacheShape };

/** Batched paged attention as a service. */
export class AttentionService {
  readonly registry: BackendRegistry;
  readonly device: DeviceProvider;
  readonly caches: CacheStore;
  readonly plans: PlanCache;
  readonly limits: Readonly<CallLimits>;
  /** What {@link forward} uses of this service (fixed: made once, not per call). */
  readonly #forwardHost: ForwardHost;

  /** @throws EnvValueError where a variable the service reads lazily holds a value its rule refuses. */
  constructor(opts: AttentionServiceOptions) {
    checkServiceEnv();
    this.device = opts.device;
    this.registry = new BackendRegistry(opts.backends, () => opts.device.current());
    this.caches = new CacheStore(opts.memoryBudgetBytes);
    this.plans = new PlanCache(opts.planCacheSize);
    this.limits = Object.freeze({ ...DEFAULT_CALL_LIMITS, ...opts.limits });
    this.#forwardHost = {
      registry: this.registry,
      caches: this.caches,
      plans: this.plans,
      limits: this.limits,
      ctx: () => this.#ctx(),
      requireDevice: (name) => this.#requireDevice(name),
    };
  }

  /** The device report (`GET /v1/device`). */
  deviceReport(): DeviceReport {
    return this.device.report();
  }

  /** Every backend with its availability and capabilities (`GET /v1/backends`). */
  backends(): ReturnType<BackendRegistry["describe"]> {
    return this.registry.describe();
  }

  /**
   * Selects a backend for a (partial) selector config, or validates a forced one; says why each
   * other backend cannot run it (`rejected`: passed over before the winner; `unsupported`: the rest).
   * @throws NoValidBackendError 422; ServiceError 404 `unknown_backend`.
   */
  select(cfg: Partial<SelectorConfig>, backend?: string): SelectResult {
    this.#requireDevice(backend);
    const full = selectorConfigDefaults(cfg);
    const r = this.registry.select(full, { backend: forced(backend) });
    const unsupported: Record<string, string[]> = {};
    for (const b of this.registry.list()) {
      if (b === r.backend || b.name in r.rejected) continue;
      const reasons = this.registry.validate(b, full);
      if (reasons.length > 0) unsupported[b.name] = reasons;
    }
    return { backend: r.backend.name, block_size: r.block_size, rejected: r.rejected, unsupported };
  }

  /** The live device at once; a new one acquired (awaited) only when the last one was lost. */
  #ctx(): BackendContext | Promise<BackendContext> {
    const gpu = this.device.current();
    if (gpu || this.device.report().generation === 0) return { gpu };
    return this.device.acquire().then((g) => ({ gpu: g }));
  }

  /**
   * A forced backend that needs a device while there is none: 503 (not a 422 config problem;
   * the contract's "no device"). On a service with no WebGPU runtime at all (`--no-gpu`: runtime
   * "none") that is permanent, and the 503 says so (no `Retry-After`, not logged).
   */
  #requireDevice(name: string | undefined): void {
    const n = forced(name);
    if (n === undefined) return;
    const b = this.registry.get(n);
    if (b.requires.needs_device && !this.device.current()) {
      const r = this.device.report();
      const permanent = r.runtime === "none";
      throw new DeviceUnavailableError(
        `backend ${n} needs a WebGPU device and there is none${r.reason ? ` (${r.reason})` : ""}` +
          (permanent ? "; this server runs without one, so retrying cannot help" : ""),
        { permanent },
      );
    }
  }

  #info(s: StoredCache): CacheInfo {
    const spec = s.cache.spec;
    return {
      id: s.id,
      ...spec,
      bytes: s.cache.bytes,
      storage: s.cache.storage,
      storage_dtype: resolveStorage(spec.kv_cache_dtype, spec.dtype),
      backend: s.backend,
      lost: s.cache.lost === true,
      created_at: s.created_at,
    };
  }

  /**
   * Creates a server-held cache with the chosen (or forced) backend, named by a random UUID.
   * @throws 422 `no_valid_backend` / `memory_budget_exceeded`; 404 `unknown_backend`.
   */
  async createCache(req: CreateCacheRequest): Promise<CacheInfo> {
    const spec = specOf(req);
    const backend = await this.#cacheBackend(spec, req.backend);
    return this.#info(await this.caches.create(backend, spec, await this.#ctx()));
  }

  /**
   * Creates the cache `id` (`PUT /v1/kv-caches/{id}`), or finds it: idempotent for the same
   * spec (`created: false`), a 409 for another. A create or delete of the same id in progress
   * is waited for first.
   * @throws 409 `cache_conflict`; as {@link createCache} otherwise.
   */
  async putCache(
    id: string,
    req: CreateCacheRequest,
  ): Promise<{ info: CacheInfo; created: boolean }> {
    const spec = specOf(req);
    // An unknown forced backend is a 404 whether or not the id is held (not a 409 naming it).
    if (req.backend !== undefined && req.backend !== "auto") this.registry.get(req.backend);
    for (;;) {
      const busy = this.caches.busy(id);
      if (busy) {
        await busy;
        continue;
      }
      const held = this.caches.peek(id);
      if (held) {
        requireSameSpec(id, { spec: held.cache.spec, backend: held.backend }, req);
        return { info: this.#info(held), created: false };
      }
      const backend = await this.#cacheBackend(spec, req.backend);
      const ctx = await this.#ctx();
      if (this.caches.busy(id) || this.caches.peek(id)) continue; // taken while we waited
      return { info: this.#info(await this.caches.create(backend, spec, ctx, id)), created: true };
    }
  }

  /**
   * The backend a new cache of `spec` gets (the forced one, validated, or the best valid one),
   * after the spec's own check (422 `invalid_cache_spec`, before the selector sees its values).
   */
  async #cacheBackend(spec: KvCacheSpec, name: string | undefined): Promise<AttentionBackend> {
    checkCacheSpec(spec);
    const cfg = selectorConfigDefaults({
      head_size: spec.head_size,
      dtype: spec.dtype,
      kv_cache_dtype: spec.kv_cache_dtype,
      block_size: spec.block_size,
      kv_cache_layout: spec.layout,
    });
    await this.#ctx();
    this.#requireDevice(name);
    return this.registry.select(cfg, { backend: forced(name) }).backend;
  }

  /**
   * Replaces a cache's contents with a cache file's (`PUT /v1/kv-caches/{id}/data`): checked
   * against the cache first, then imported by the cache's backend into new storage that takes
   * the old one's place under the cache's mutex; a failure changes nothing. A lost cache is
   * restored this way.
   * @throws 404; 422 `cache_data_mismatch` / `memory_budget_exceeded`; 503 without a device.
   */
  async importCacheData(id: string, file: CacheFile): Promise<CacheInfo> {
    checkCacheFile(file, this.caches.get(id).cache.spec, id); // refused before any wait
    const ctx = await this.#ctx();
    const own = (b: Uint8Array) => (b.byteOffset % 8 === 0 ? b : b.slice());
    const stored = await this.caches.replace(id, (s) => {
      // Checked again against the cache under its lock: one deleted and created again with
      // the same id while the device was awaited may have another spec of the same bytes.
      checkCacheFile(file, s.cache.spec, id);
      return this.registry.get(s.backend).importCache(
        s.cache.spec,
        own(file.key_cache.data),
        own(file.value_cache.data),
        ctx,
      );
    });
    return this.#info(stored);
  }

  /** A cache's spec and state. @throws 404 `cache_not_found`. */
  getCache(id: string): CacheInfo {
    return this.#info(this.caches.get(id));
  }

  /**
   * What {@link cacheData} holds besides the bytes (its info and shape), without reading them
   * (`HEAD .../data`). @throws 404; 503 when lost.
   */
  cacheDataInfo(id: string): Pick<CacheData, "info" | "shape"> {
    const s = this.caches.get(id);
    if (s.cache.lost) throw cacheLost(id);
    return { info: this.#info(s), shape: cacheShape(s.cache.spec) };
  }

  /** A cache's contents (read under its mutex). @throws 404; 503 when lost. */
  cacheData(id: string): Promise<CacheData> {
    return this.caches.withCache(id, async (s) => {
      if (s.cache.lost) throw cacheLost(id);
      const { key, value } = await s.cache.read();
      return { info: this.#info(s), shape: cacheShape(s.cache.spec), key, value };
    });
  }

  /** Frees a cache once its in-flight work is done. @throws 404. */
  deleteCache(id: string): Promise<void> {
    return this.caches.delete(id);
  }

  /**
   * One batched forward: validate once (nothing is written if this fails), select, wrap an
   * inline cache with the chosen backend (its bytes count against the memory budget while the
   * call runs), get the plan (cached by shape), run. A large batch's NaN/infinity scan is left
   * to a plan that checks on the device before writing (`checks_finite`), else done before run.
   * @throws 400/404/422/503 ServiceErrors; 499 when `signal` aborted before the call ran; 503
   * `queue_timeout` when it waited past `queueTimeoutMs` before it ran.
   */
  forward(input: ForwardInput, opts: ForwardOptions = {}): Promise<ForwardOutcome> {
    return runForward(this.#forwardHost, input, opts);
  }

  /** Has every backend start what its first call would ({@link AttentionBackend.prewarm}). */
  prewarm(): void {
    for (const b of this.registry.list()) b.prewarm?.();
  }

  /** Frees every server-held cache and plan, and closes the backends (their workers). */
  async close(): Promise<void> {
    this.plans.clear();
    await this.caches.clear();
    await Promise.all(this.registry.list().map((b) => b.close?.()));
  }
}
