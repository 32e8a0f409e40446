/**
 * Server-held KV caches: created through a backend's `createCache`, named by random UUIDs or
 * by the client's id, bounded by a total memory budget, and serialised per cache — work on one
 * cache runs under that cache's async mutex (so a forward never interleaves with another write
 * to it), while different caches run concurrently; a forward hands the mutex on once its GPU
 * work is submitted (the device queue orders what follows), so calls on one cache keep their
 * order while their read-backs overlap. Deleting a cache waits for its work in flight to be
 * submitted; {@link CacheStore.busy} tells when an id is being created or deleted, so a create
 * with the client's id can wait for it. {@link CacheStore.replace} swaps a cache's storage for a
 * new one (an import) under its mutex.
 * @module
 */
import { bytesPerElement, resolveStorage } from "../core/dtype.ts";
import { ServiceError } from "../core/errors.ts";
import type { AttentionBackend, BackendContext, KvCache, KvCacheSpec } from "../core/types.ts";

/** One server-held cache. */
export interface StoredCache {
  readonly id: string;
  /** The backend that created it (its storage kind follows the backend). */
  readonly backend: string;
  readonly cache: KvCache;
  readonly created_at: string;
}

/** Bytes of K plus V for a spec. */
export function cacheBytes(spec: KvCacheSpec): number {
  const elems = spec.num_blocks * spec.block_size * spec.num_kv_heads * spec.head_size;
  return 2 * elems * bytesPerElement(resolveStorage(spec.kv_cache_dtype, spec.dtype));
}

/**
 * A minimal FIFO async mutex whose holder may hand the turn on before it finishes: `fn` gets
 * `unlock`, and the next holder starts once `fn` settles or calls it, whichever comes first. A
 * forward unlocks once its GPU work is submitted: the device queue keeps later work on the
 * cache after it, so only the host side had to wait, and the read-back need not.
 */
class Mutex {
  #tail: Promise<void> = Promise.resolve();
  #pending = 0;
  /** Runs `fn` once every earlier holder has finished or unlocked. */
  run<T>(fn: (unlock: () => void) => Promise<T> | T): Promise<T> {
    this.#pending++;
    let unlock!: () => void;
    const turn = new Promise<void>((resolve) => unlock = resolve);
    const result = this.#tail.then(() => fn(unlock));
    result.then(unlock, unlock);
    result.then(() => this.#pending--, () => this.#pending--);
    this.#tail = turn;
    return result;
  }
  /** Holders running (read-backs included) or queued. */
  get pending(): number {
    return this.#pending;
  }
}

interface Entry {
  /** Replaced (same id, new storage) by {@link CacheStore.replace}. */
  stored: StoredCache;
  mutex: Mutex;
  deleting: boolean;
}

function notFound(id: string): ServiceError {
  return new ServiceError(`no KV cache with id ${JSON.stringify(id)}`, {
    status: 404,
    code: "cache_not_found",
    extra: { cache_id: id },
  });
}

/** The set of server-held caches and their memory budget. */
export class CacheStore {
  readonly budgetBytes: number;
  #entries = new Map<string, Entry>();
  /** Ids whose create or delete is in progress, and when it settles (never rejects). */
  #busy = new Map<string, Promise<void>>();
  /** Bytes of live caches plus reservations for creates in flight. */
  #used = 0;

  /** @param budgetBytes total bytes all caches together may hold. */
  constructor(budgetBytes: number) {
    if (!(budgetBytes >= 0)) throw new RangeError(`memory budget must be >= 0, got ${budgetBytes}`);
    this.budgetBytes = budgetBytes;
  }

  /** Bytes in use (live caches and creates in flight). */
  get usedBytes(): number {
    return this.#used;
  }

  /** Bytes still available. */
  get remainingBytes(): number {
    return this.budgetBytes - this.#used;
  }

  /**
   * Creates a cache with `backend.createCache`, named `id` (default a random UUID). The bytes
   * are reserved before allocation, so concurrent creates never overshoot the budget; the id is
   * {@link busy} until the create settles.
   * @throws ServiceError 422 `memory_budget_exceeded` (nothing allocated) when it does not fit;
   *   409 `cache_busy` when `id` is taken or busy (callers check {@link peek} and {@link busy}).
   */
  async create(
    backend: AttentionBackend,
    spec: KvCacheSpec,
    ctx: BackendContext,
    id: string = crypto.randomUUID(),
  ): Promise<StoredCache> {
    if (this.#entries.has(id) || this.#busy.has(id)) {
      throw new ServiceError(`KV cache id ${JSON.stringify(id)} is taken or being changed`, {
        status: 409,
        code: "cache_busy",
        extra: { cache_id: id },
      });
    }
    const want = cacheBytes(spec);
    if (want > this.remainingBytes) throw this.#overBudget(want);
    this.#used += want;
    const settle = this.#markBusy(id);
    let cache: KvCache;
    try {
      cache = await backend.createCache(spec, ctx);
    } catch (e) {
      this.#used -= want;
      settle();
      throw e;
    }
    // Account what the backend actually holds (it may pad).
    this.#used += cache.bytes - want;
    const stored: StoredCache = {
      id,
      backend: backend.name,
      cache,
      created_at: new Date().toISOString(),
    };
    this.#entries.set(stored.id, { stored, mutex: new Mutex(), deleting: false });
    settle();
    return stored;
  }

  /** Marks `id` busy; returns the function that ends it. */
  #markBusy(id: string): () => void {
    let settle!: () => void;
    this.#busy.set(id, new Promise<void>((r) => settle = r));
    return () => {
      this.#busy.delete(id);
      settle();
    };
  }

  /** When `id` is being created or deleted, a promise that resolves once that is over; else null. */
  busy(id: string): Promise<void> | null {
    return this.#busy.get(id) ?? null;
  }

  /** The live cache named `id`, or undefined (also while it is being deleted). */
  peek(id: string): StoredCache | undefined {
    const e = this.#entries.get(id);
    return e && !e.deleting ? e.stored : undefined;
  }

  /**
   * Replaces a cache's storage under its mutex: `build` makes the new one (from the old entry),
   * then the old one is destroyed. The new one's bytes are reserved while it is built, so an
   * import needs room for both for a moment. When `build` fails, nothing changed. Asked for
   * before a delete began, it runs before the delete (work already queued finishes).
   * @throws ServiceError 404 when the cache is unknown or being deleted; 422
   * `memory_budget_exceeded`.
   */
  replace(id: string, build: (s: StoredCache) => Promise<KvCache> | KvCache): Promise<StoredCache> {
    const e = this.#entries.get(id);
    if (!e || e.deleting) return Promise.reject(notFound(id));
    return e.mutex.run(async () => {
      // Queued before a delete began: it finishes first, as any queued work does.
      if (e.deleting && this.#entries.get(id) !== e) throw notFound(id);
      const old = e.stored;
      const release = this.reserve(cacheBytes(old.cache.spec));
      let cache: KvCache;
      try {
        cache = await build(old);
      } finally {
        release();
      }
      this.#used += cache.bytes - old.cache.bytes;
      e.stored = { ...old, cache };
      old.cache.destroy();
      return e.stored;
    });
  }

  /**
   * Reserves `bytes` of the budget for the duration of one call (an inline cache); returns
   * the function that gives them back.
   * @throws ServiceError 422 `memory_budget_exceeded` when they do not fit.
   */
  reserve(bytes: number): () => void {
    if (bytes > this.remainingBytes) throw this.#overBudget(bytes);
    this.#used += bytes;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.#used -= bytes;
    };
  }

  #overBudget(want: number): ServiceError {
    return new ServiceError(
      `a cache of ${want} bytes exceeds the memory budget: ${this.remainingBytes} of ${this.budgetBytes} bytes remain`,
      {
        status: 422,
        code: "memory_budget_exceeded",
        extra: {
          requested_bytes: want,
          remaining_bytes: this.remainingBytes,
          budget_bytes: this.budgetBytes,
        },
      },
    );
  }

  /**
   * The cache named `id`.
   * @throws ServiceError 404 `cache_not_found` (also once a delete has begun).
   */
  get(id: string): StoredCache {
    const e = this.#entries.get(id);
    if (!e || e.deleting) throw notFound(id);
    return e.stored;
  }

  /** Every live cache. */
  list(): StoredCache[] {
    return [...this.#entries.values()].filter((e) => !e.deleting).map((e) => e.stored);
  }

  /**
   * Runs `fn` holding the cache's mutex. Work on other caches is not blocked. `fn` may call
   * `unlock` once what it does to the cache is ordered on the device (its commands submitted):
   * the next holder then starts while `fn` still reads its results back.
   * @throws ServiceError 404 when the cache is unknown or was deleted while waiting.
   */
  withCache<T>(
    id: string,
    fn: (c: StoredCache, unlock: () => void) => Promise<T> | T,
  ): Promise<T> {
    const e = this.#entries.get(id);
    if (!e || e.deleting) return Promise.reject(notFound(id));
    return e.mutex.run((unlock) => {
      if (e.deleting && this.#entries.get(id) !== e) throw notFound(id);
      return fn(e.stored, unlock);
    });
  }

  /**
   * Deletes a cache: new work is refused at once (404), work already queued finishes, then the
   * memory is freed.
   * @throws ServiceError 404 when the cache is unknown.
   */
  async delete(id: string): Promise<void> {
    const e = this.#entries.get(id);
    if (!e || e.deleting) throw notFound(id);
    e.deleting = true;
    const settle = this.#markBusy(id);
    try {
      await e.mutex.run(() => {
        this.#entries.delete(id);
        this.#used -= e.stored.cache.bytes;
        e.stored.cache.destroy();
      });
    } finally {
      settle();
    }
  }

  /** Destroys every cache (shutdown). */
  async clear(): Promise<void> {
    await Promise.all([...this.#entries.keys()].map((id) => this.delete(id).catch(() => {})));
  }
}
