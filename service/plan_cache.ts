/**
 * Plans cached by batch shape (FlashInfer's plan/run split): a backend's plan depends only on
 * a {@link BatchShape}, so calls with the same shape and metadata (the layers of one engine
 * step) reuse one plan. The key is the backend, the device generation and the shape's
 * `plan_key` (its scalars, service/batch_key.ts); under one key the cache keeps up to
 * {@link PLAN_VARIANTS} plans, most recently used first, each with a copy of the metadata it
 * was built for, and hands out the one whose metadata equals the call's by value: two batches
 * share a plan only when their metadata is equal, never through a hash. A decode step's new
 * seq_lens and slots miss (the backend plans them again, cheaply: backends/decode_plan.ts) and
 * push the oldest variant out; several engines stepping the same shape keep a variant each.
 * Least recently used plans are dropped past the limit; a dropped plan is disposed once no
 * call holds it. A new device generation misses by construction, and the plans of a device are
 * dropped when it is lost (the cache watches each device it plans on, gpu/device.ts
 * onDeviceLost): they hold the dead device's buffers and their tables' memory, which the LRU
 * alone would keep until newer plans pushed them out. A plan made on a device already lost (a
 * call that took the context just before the loss) is handed out but never cached.
 * {@link PlanCache.clear} drops everything (shutdown).
 * @module
 */
import type {
  AttentionBackend,
  BackendContext,
  BatchShape,
  GpuContext,
  PlanContract,
} from "../core/types.ts";
import { keyArrays } from "./batch_key.ts";
import { TABLE_MEMORY, type TableLease } from "../gpu/plan_table.ts";
import { onDeviceLost } from "../gpu/device.ts";

/** Plans kept under one plan key (metadata variants of one shape). */
export const PLAN_VARIANTS = 4;

interface Entry {
  key: string;
  backend: AttentionBackend;
  /** The device the plan was made on (null: host). */
  device: GPUDevice | null;
  plan: Promise<PlanContract>;
  arrays: (ArrayLike<number> | null)[];
  /** The memory of `arrays`. */
  lease: TableLease;
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

/** Whether `a` and `b` hold equal arrays (in order: keyArrays puts the block table last). */
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

/**
 * A copy of `a` in lent memory (one lease for every array; a fresh 16 KiB block-table copy per
 * decode step cost more than comparing it), returned when the entry leaves the cache.
 */
function copy(
  a: (ArrayLike<number> | null)[],
): { arrays: (Int32Array | null)[]; lease: TableLease } {
  let words = 0;
  for (const x of a) words += x?.length ?? 0;
  const lease = TABLE_MEMORY.acquire(4 * words);
  const all = new Int32Array(lease.bytes.buffer, 0, words);
  let at = 0;
  const arrays = a.map((x) => {
    if (!x) return null;
    const view = all.subarray(at, at + x.length);
    view.set(x);
    at += x.length;
    return view;
  });
  return { arrays, lease };
}

/** The plan cache of one service. */
export class PlanCache {
  readonly limit: number;
  /** Variants by key, most recently used first. */
  #buckets = new Map<string, Entry[]>();
  /** Every entry, least recently used first. */
  #lru = new Set<Entry>();
  #hits = 0;
  #misses = 0;
  #disposed = 0;
  /** The devices whose loss is watched, each with its unregister function. */
  #watched = new Map<GPUDevice, () => void>();

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
    let bucket = this.#buckets.get(key);
    let e = bucket?.find((x) => x.backend === backend && sameArrays(x.arrays, arrays));
    const hit = e !== undefined;
    if (!e) {
      this.#misses++;
      if (ctx.gpu) this.#watch(ctx.gpu);
      e = {
        key,
        backend: backend as AttentionBackend,
        device: ctx.gpu?.device ?? null,
        plan: Promise.resolve().then(() => backend.plan(shape, ctx)),
        ...copy(arrays),
        holders: 0,
        dropped: false,
      };
      if (!bucket) this.#buckets.set(key, bucket = []);
      bucket.unshift(e);
      this.#lru.add(e);
      const entry = e;
      entry.plan.catch(() => this.#remove(entry));
      while (bucket.length > PLAN_VARIANTS) this.#drop(bucket[bucket.length - 1]);
      this.#evict();
    } else {
      this.#hits++;
      this.#lru.delete(e); // most recently used goes last
      this.#lru.add(e);
      if (bucket![0] !== e) {
        bucket!.splice(bucket!.indexOf(e), 1);
        bucket!.unshift(e);
      }
    }
    const entry = e;
    entry.holders++;
    // The device was lost before this call planned on it: the plan is this call's alone.
    if (ctx.gpu?.lost && !entry.dropped) this.#drop(entry);
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
    while (this.#lru.size > this.limit) this.#drop(this.#lru.values().next().value!);
  }

  /** Takes `e` out of the cache (it is no longer handed out). */
  #remove(e: Entry): void {
    this.#lru.delete(e);
    const bucket = this.#buckets.get(e.key);
    const i = bucket?.indexOf(e) ?? -1;
    if (i < 0) return;
    e.lease.release(); // nothing compares against it any more
    bucket!.splice(i, 1);
    if (bucket!.length === 0) this.#buckets.delete(e.key);
  }

  #drop(e: Entry): void {
    this.#remove(e);
    e.dropped = true;
    if (e.holders === 0) this.#dispose(e);
  }

  #dispose(e: Entry): void {
    e.plan.then((p) => {
      this.#disposed++;
      e.backend.disposePlan?.(p);
    }, () => {});
  }

  /** Drops the plans of `gpu`'s device when it is lost (once per device). */
  #watch(gpu: GpuContext): void {
    const device = gpu.device;
    if (this.#watched.has(device)) return;
    this.#watched.set(
      device,
      onDeviceLost(gpu, () => {
        this.#watched.delete(device);
        this.dropDevice(device);
      }),
    );
  }

  /** Drops every plan made on `device` (each disposed once no call holds it). */
  dropDevice(device: GPUDevice): void {
    for (const e of [...this.#lru]) if (e.device === device) this.#drop(e);
  }

  /** Drops every plan (each disposed once no call holds it) and stops watching devices. */
  clear(): void {
    for (const unwatch of this.#watched.values()) unwatch();
    this.#watched.clear();
    for (const e of [...this.#lru]) this.#drop(e);
  }

  stats(): PlanCacheStats {
    return {
      size: this.#lru.size,
      hits: this.#hits,
      misses: this.#misses,
      disposed: this.#disposed,
    };
  }
}
