/**
 * The attention service: backends (through the registry), the device, server-held caches and
 * the forward call, independent of HTTP. There is no global lock: forwards run concurrently,
 * and only work on the same server-held cache is serialised (by that cache's mutex).
 * A rejected call changes no cache: everything is validated before a backend writes.
 * @module
 */
import { resolveStorage } from "../core/dtype.ts";
import { DeviceUnavailableError } from "../core/errors.ts";
import type {
  AttentionBackend,
  BackendContext,
  CacheStorage,
  DeviceProvider,
  DeviceReport,
  DType,
  ForwardResult,
  KvCache,
  KvCacheDType,
  KvCacheSpec,
  KvLayout,
  SelectorConfig,
  StorageDType,
} from "../core/types.ts";
import { BackendRegistry, selectorConfigDefaults } from "../backends/registry.ts";
import { CacheStore, type StoredCache } from "./cache_store.ts";
import { type ForwardInput, validateForward } from "./forward.ts";

/** Options of {@link AttentionService}. */
export interface AttentionServiceOptions {
  backends: AttentionBackend[];
  device: DeviceProvider;
  /** Total bytes all server-held caches may hold. */
  memoryBudgetBytes: number;
}

/** `POST /v1/kv-caches` body. */
export interface CreateCacheRequest {
  num_blocks: number;
  block_size: number;
  num_kv_heads: number;
  head_size: number;
  dtype: DType;
  kv_cache_dtype?: KvCacheDType;
  layout?: KvLayout;
  /** A backend name, or "auto"/absent for the best valid one. */
  backend?: string;
}

/** What `GET /v1/kv-caches/{id}` reports. */
export interface CacheInfo extends KvCacheSpec {
  id: string;
  bytes: number;
  storage: CacheStorage;
  /** The physical element type (kv_cache_dtype with `auto` resolved). */
  storage_dtype: StorageDType;
  backend: string;
  lost: boolean;
  created_at: string;
}

/** A cache's contents, in its storage dtype and layout shape. */
export interface CacheData {
  info: CacheInfo;
  /** [num_blocks, block_size, num_kv_heads, head_size] (NHD) or [num_blocks, num_kv_heads, block_size, head_size] (HND). */
  shape: number[];
  key: Uint8Array;
  value: Uint8Array;
}

/** The answer of a selection. */
export interface SelectResult {
  backend: string;
  block_size: number;
  rejected: Record<string, string[]>;
}

/** What a forward returns. */
export interface ForwardOutcome {
  backend: string;
  result: ForwardResult;
  dtype: DType;
  num_tokens: number;
  num_heads: number;
  head_size: number;
}

/** The shape of a cache tensor in its layout. */
export function cacheShape(spec: KvCacheSpec): number[] {
  return spec.layout === "NHD"
    ? [spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size]
    : [spec.num_blocks, spec.num_kv_heads, spec.block_size, spec.head_size];
}

const forced = (b?: string) => (b === undefined || b === "auto" ? undefined : b);

function cacheLost(id: string): DeviceUnavailableError {
  return new DeviceUnavailableError(
    `KV cache ${id} was lost with its device; its contents are gone`,
  );
}

/** Batched paged attention as a service. */
export class AttentionService {
  readonly registry: BackendRegistry;
  readonly device: DeviceProvider;
  readonly caches: CacheStore;

  constructor(opts: AttentionServiceOptions) {
    this.device = opts.device;
    this.registry = new BackendRegistry(opts.backends, () => opts.device.current());
    this.caches = new CacheStore(opts.memoryBudgetBytes);
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
   * Selects a backend for a (partial) selector config, or validates a forced one.
   * @throws NoValidBackendError 422; ServiceError 404 `unknown_backend`.
   */
  select(cfg: Partial<SelectorConfig>, backend?: string): SelectResult {
    this.#requireDevice(backend);
    const r = this.registry.select(selectorConfigDefaults(cfg), { backend: forced(backend) });
    return { backend: r.backend.name, block_size: r.block_size, rejected: r.rejected };
  }

  async #ctx(): Promise<BackendContext> {
    let gpu = this.device.current();
    if (!gpu && this.device.report().generation > 0) gpu = await this.device.acquire();
    return { gpu };
  }

  /** A forced backend that needs a device while there is none: 503 (not a 422 config problem). */
  #requireDevice(name: string | undefined): void {
    const n = forced(name);
    if (n === undefined) return;
    const b = this.registry.get(n);
    if (b.requires.needs_device && !this.device.current()) {
      const r = this.device.report();
      throw new DeviceUnavailableError(
        `backend ${n} needs a WebGPU device and there is none${r.reason ? ` (${r.reason})` : ""}`,
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
   * Creates a server-held cache with the chosen (or forced) backend.
   * @throws 422 `no_valid_backend` / `memory_budget_exceeded`; 404 `unknown_backend`.
   */
  async createCache(req: CreateCacheRequest): Promise<CacheInfo> {
    const spec: KvCacheSpec = {
      num_blocks: req.num_blocks,
      block_size: req.block_size,
      num_kv_heads: req.num_kv_heads,
      head_size: req.head_size,
      dtype: req.dtype,
      kv_cache_dtype: req.kv_cache_dtype ?? "auto",
      layout: req.layout ?? "NHD",
    };
    const cfg = selectorConfigDefaults({
      head_size: spec.head_size,
      dtype: spec.dtype,
      kv_cache_dtype: spec.kv_cache_dtype,
      block_size: spec.block_size,
      kv_cache_layout: spec.layout,
    });
    await this.#ctx();
    this.#requireDevice(req.backend);
    const { backend } = this.registry.select(cfg, { backend: forced(req.backend) });
    const stored = await this.caches.create(backend, spec, await this.#ctx());
    return this.#info(stored);
  }

  /** A cache's spec and state. @throws 404 `cache_not_found`. */
  getCache(id: string): CacheInfo {
    return this.#info(this.caches.get(id));
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
   * One batched forward: validate (nothing is written if this fails), select, wrap an inline
   * cache with the chosen backend, plan, run.
   * @throws 400/404/422/503 ServiceErrors.
   */
  async forward(input: ForwardInput, _opts?: { signal?: AbortSignal }): Promise<ForwardOutcome> {
    const t0 = performance.now();
    const held = input.kv_cache !== undefined ? this.caches.get(input.kv_cache) : null;
    if (held?.cache.lost) throw cacheLost(held.id);
    const v = validateForward(
      input,
      held ? { spec: held.cache.spec, storage: held.cache.storage } : null,
    );
    const ctx = await this.#ctx();
    this.#requireDevice(input.backend);
    const { backend } = this.registry.select(v.selector, { backend: forced(input.backend) });
    const tValidated = performance.now();
    const exec = async (cache: KvCache | null): Promise<ForwardResult> => {
      const batch = { ...v.batch, cache };
      const plan = await backend.plan(batch, ctx);
      return await backend.run(plan, batch, ctx);
    };
    let result: ForwardResult;
    if (held) {
      result = await this.caches.withCache(held.id, (s) => {
        if (s.cache.lost) throw cacheLost(s.id);
        return exec(s.cache);
      });
    } else if (v.inline) {
      const cache = await backend.importCache(v.inline.spec, v.inline.key, v.inline.value, ctx);
      try {
        result = await exec(cache);
      } finally {
        cache.destroy();
      }
    } else {
      result = await exec(null);
    }
    const timings = {
      ...result.timings,
      validate: tValidated - t0,
      total: performance.now() - t0,
    };
    return {
      backend: backend.name,
      result: { ...result, timings },
      dtype: v.batch.dtype,
      num_tokens: v.batch.num_tokens,
      num_heads: v.batch.layer.num_heads,
      head_size: v.batch.layer.head_size,
    };
  }

  /** Frees every server-held cache. */
  close(): Promise<void> {
    return this.caches.clear();
  }
}
