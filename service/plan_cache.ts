/**
 * Plans cached by batch shape (FlashInfer's plan/run split): a backend's plan depends only on
 * a {@link BatchShape}, so calls whose shape keys agree (the layers of one engine step share
 * their metadata) reuse one plan. The key is the backend, the device generation and the
 * shape's `plan_key`; on a hit the metadata arrays are compared by value as well, so a hash
 * collision can never hand out a wrong plan. Least recently used plans are dropped past the
 * limit; a dropped plan is disposed once no call holds it. A new device generation misses by
 * construction; {@link PlanCache.clear} drops everything (device loss, shutdown).
 * @module
 */
import type { AttentionBackend, BackendContext, BatchShape, PlanContract } from "../core/types.ts";
import { keyArrays } from "./batch_key.ts";

interface Entry {
  backend: AttentionBackend;
  plan: Promise<PlanContract>;
  arrays: (ArrayLike<number> | null)[];
  holders: number;
  dropped: boolean;
}

/** A plan lent to one call; `release()` when the call is done. */
export interface HeldPlan<P> {
  plan: P;
  /** Whether the plan came from the cache. */
  hit: boolean;
  release(): void;
}

/** Counters (tests and metrics). */
export interface PlanCacheStats {
  size: number;
  hits: number;
  misses: number;
  disposed: number;
}

function sameArrays(a: (ArrayLike<number> | null)[], b: (ArrayLike<number> | null)[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i], y = b[i];
    if (x === y) continue;
    if (!x || !y || x.length !== y.length) return false;
    for (let j = 0; j < x.length; j++) if (x[j] !== y[j]) return false;
  }
  return true;
}

const copy = (a: (ArrayLike<number> | null)[]) =>
  a.map((x) => (x instanceof Int32Array ? x.slice() : x ? Int32Array.from(x) : null));

/** The plan cache of one service. */
export class PlanCache {
  readonly limit: number;
  #entries = new Map<string, Entry>();
  #hits = 0;
  #misses = 0;
  #disposed = 0;

  constructor(limit = 256) {
    this.limit = limit;
  }

  /** The plan of `shape` on `backend` (cached), held until `release()`. */
  async get<P extends PlanContract>(
    backend: AttentionBackend<P>,
    shape: BatchShape,
    ctx: BackendContext,
  ): Promise<HeldPlan<P>> {
    const key = `${backend.name}|${ctx.gpu ? ctx.gpu.generation : "host"}|${shape.plan_key}`;
    const arrays = keyArrays(shape.layer, shape.metadata);
    let e = this.#entries.get(key);
    let hit = true;
    if (!e || e.backend !== backend || !sameArrays(e.arrays, arrays)) {
      hit = false;
      this.#misses++;
      if (e) this.#drop(key, e);
      e = {
        backend: backend as AttentionBackend,
        plan: Promise.resolve().then(() => backend.plan(shape, ctx)),
        arrays: copy(arrays),
        holders: 0,
        dropped: false,
      };
      this.#entries.set(key, e);
      const entry = e;
      entry.plan.catch(() => {
        if (this.#entries.get(key) === entry) this.#entries.delete(key);
      });
      this.#evict();
    } else {
      this.#hits++;
      this.#entries.delete(key); // most recently used goes last
      this.#entries.set(key, e);
    }
    const entry = e;
    entry.holders++;
    try {
      const plan = (await entry.plan) as P;
      let released = false;
      return {
        plan,
        hit,
        release: () => {
          if (released) return;
          released = true;
          entry.holders--;
          if (entry.dropped && entry.holders === 0) this.#dispose(entry);
        },
      };
    } catch (err) {
      entry.holders--;
      throw err;
    }
  }

  #evict(): void {
    while (this.#entries.size > this.limit) {
      const [key, e] = this.#entries.entries().next().value!;
      this.#drop(key, e);
    }
  }

  #drop(key: string, e: Entry): void {
    if (this.#entries.get(key) === e) this.#entries.delete(key);
    e.dropped = true;
    if (e.holders === 0) this.#dispose(e);
  }

  #dispose(e: Entry): void {
    e.plan.then((p) => {
      this.#disposed++;
      e.backend.disposePlan?.(p);
    }, () => {});
  }

  /** Drops every plan (each disposed once no call holds it). */
  clear(): void {
    for (const [k, e] of [...this.#entries]) this.#drop(k, e);
  }

  stats(): PlanCacheStats {
    return {
      size: this.#entries.size,
      hits: this.#hits,
      misses: this.#misses,
      disposed: this.#disposed,
    };
  }
}
