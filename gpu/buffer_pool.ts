/**
 * A per-device pool of GPU buffers in power-of-two size classes (256 B and up), by usage. A
 * call acquires what it needs and releases everything once its readback resolved (the GPU is
 * done with the buffers then), so steady-state calls create no buffers. Free buffers beyond
 * `maxFreeBytes` are destroyed, largest classes first; a device loss drops the pool with the
 * device (pools are keyed by device; a lost device's pool destroys its free buffers and those
 * released later, and leaves {@link bufferPoolTotals}). Timestamp query sets are pooled the
 * same way, by count.
 *
 * Memory: the free buffers (at most `maxFreeBytes` a device, default 1 GiB,
 * `ATTN_GPU_POOL_MAX_FREE_BYTES`) and those in use are outside `--memory-budget-bytes`, which
 * counts KV caches only; each device thread has its own device, so its own pool. /metrics shows
 * them: `attn_gpu_buffer_pool_{free,in_use,max_free}_bytes` and the buffers created and reused
 * (server/metrics_pools.ts).
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { envInt, type EnvSetting, envVar, readSetting, settingValue } from "../core/env.ts";
import { onDeviceLost, WebGpuContext } from "./device.ts";

/** Free query sets kept per size. */
const MAX_FREE_QUERY_SETS = 16;

/** Smallest size class, bytes. */
export const MIN_POOLED_BYTES = 256;

/** The size class (a power of two, at least `min`) a request of `bytes` is served from. */
export function sizeClass(bytes: number, min = MIN_POOLED_BYTES): number {
  let c = min;
  while (c < bytes) c *= 2;
  return c;
}

/** The default cap on a pool's free bytes (GPU buffers a device, host memory a thread): 1 GiB. */
export const DEFAULT_POOL_MAX_FREE_BYTES = 2 ** 30;

/**
 * The rule of a pool's cap on free bytes, the environment variable `name`: an integer >= 0
 * (0 keeps nothing free), default {@link DEFAULT_POOL_MAX_FREE_BYTES}.
 */
export function poolCapSetting(name: string): EnvSetting<number> {
  return {
    name,
    unset: DEFAULT_POOL_MAX_FREE_BYTES,
    parse: (text) => envInt(name, text, 0, undefined, " (bytes)"),
  };
}

/**
 * A pool's cap on free bytes from the environment variable `name` ({@link poolCapSetting}).
 * @throws EnvValueError naming `name` and `value` where the rule refuses it.
 */
export function poolCapFromEnv(name: string, value: string | undefined = envVar(name)): number {
  return settingValue(poolCapSetting(name), value);
}

/** The environment variable capping each device's free GPU buffer bytes. */
export const GPU_POOL_CAP_ENV = "ATTN_GPU_POOL_MAX_FREE_BYTES";
/** Its rule ({@link poolCapSetting}). */
export const GPU_POOL_CAP_SETTING: EnvSetting<number> = poolCapSetting(GPU_POOL_CAP_ENV);

/** Counters of a pool (tests and /metrics). */
export interface PoolStats {
  /** Buffers handed out and not yet released. */
  in_use: number;
  /** Bytes of the buffers in use (their size classes). */
  in_use_bytes: number;
  /** Buffers waiting in the pool. */
  free: number;
  free_bytes: number;
  /** Buffers ever created (a steady state stops growing this). */
  created: number;
  /** Acquires served from the pool. */
  reused: number;
  /** Timestamp query sets ever created (a steady state stops growing this). */
  query_sets_created: number;
}

/** The pool of one device. */
export class BufferPool {
  readonly device: GPUDevice;
  readonly maxFreeBytes: number;
  #free = new Map<string, GPUBuffer[]>();
  /** Buffers out, with their free-list key and size (no native property read on release). */
  #inUse = new Map<GPUBuffer, { key: string; size: number }>();
  #inUseBytes = 0;
  #freeBytes = 0;
  #lost = false;
  #created = 0;
  #reused = 0;
  #counts?: { created: number; reused: number };
  #querySets = new Map<number, GPUQuerySet[]>();
  #querySetsCreated = 0;
  #queryCounts = new WeakMap<GPUQuerySet, number>();

  /** `counts`: counters shared by several pools (bumped with this pool's own). */
  constructor(
    device: GPUDevice,
    maxFreeBytes = DEFAULT_POOL_MAX_FREE_BYTES,
    counts?: { created: number; reused: number },
  ) {
    this.device = device;
    this.maxFreeBytes = maxFreeBytes;
    this.#counts = counts;
  }

  /** True once {@link markLost} ran: nothing is kept free any more. */
  get lost(): boolean {
    return this.#lost;
  }

  /**
   * The device was lost: destroys the free buffers and query sets, and every buffer released
   * from now on (they would never be lent again: a new device gets a new pool).
   */
  markLost(): void {
    this.#lost = true;
    this.clear();
  }

  /**
   * A buffer of at least `bytes` (its size is the class) with exactly `usage`: `prefer` where it
   * is free in that class (the buffer this caller had last time: its bind groups are then the
   * same), else the one returned last.
   */
  acquire(bytes: number, usage: number, label = "pooled", prefer?: GPUBuffer): GPUBuffer {
    const size = sizeClass(bytes), key = `${usage}:${size}`;
    const list = this.#free.get(key);
    const at = prefer && list ? list.lastIndexOf(prefer) : -1;
    let b = at >= 0 ? list!.splice(at, 1)[0] : list?.pop();
    if (b) {
      this.#freeBytes -= size;
      this.#reused++;
      if (this.#counts) this.#counts.reused++;
    } else {
      b = this.device.createBuffer({ label, size, usage });
      this.#created++;
      if (this.#counts) this.#counts.created++;
    }
    this.#inUse.set(b, { key, size });
    this.#inUseBytes += size;
    return b;
  }

  /**
   * Returns buffers to the pool (unknown buffers are ignored; mapped ones must be unmapped).
   * Buffers released together go back in reverse, so that acquiring them again in the order
   * they were acquired gives each request the buffer it had (bind groups, cached by buffer,
   * are then reused).
   */
  release(...buffers: GPUBuffer[]): void {
    for (let i = buffers.length - 1; i >= 0; i--) {
      const b = buffers[i], out = this.#inUse.get(b);
      if (!out) continue;
      this.#inUse.delete(b);
      this.#inUseBytes -= out.size;
      if (this.#lost) {
        b.destroy();
        continue;
      }
      let list = this.#free.get(out.key);
      if (!list) this.#free.set(out.key, list = []);
      list.push(b);
      this.#freeBytes += out.size;
    }
    this.#trim();
  }

  #trim(): void {
    if (this.#freeBytes <= this.maxFreeBytes) return;
    const keys = [...this.#free.keys()].sort((a, b) =>
      Number(b.split(":")[1]) - Number(a.split(":")[1])
    );
    for (const k of keys) {
      const list = this.#free.get(k)!;
      while (list.length && this.#freeBytes > this.maxFreeBytes) {
        const b = list.pop()!;
        this.#freeBytes -= b.size;
        b.destroy();
      }
    }
  }

  /** A timestamp query set of `count` queries (pooled by count). */
  acquireQuerySet(count: number): GPUQuerySet {
    const q = this.#querySets.get(count)?.pop();
    if (q) return q;
    this.#querySetsCreated++;
    const created = this.device.createQuerySet({ type: "timestamp", count });
    this.#queryCounts.set(created, count);
    return created;
  }

  /** Returns a query set of {@link acquireQuerySet} once the call that used it resolved. */
  releaseQuerySet(q: GPUQuerySet): void {
    const count = this.#queryCounts.get(q);
    if (count === undefined) return;
    let list = this.#querySets.get(count);
    if (!list) this.#querySets.set(count, list = []);
    if (!this.#lost && list.length < MAX_FREE_QUERY_SETS) list.push(q);
    else q.destroy();
  }

  /** Destroys every free buffer and query set. */
  clear(): void {
    for (const list of this.#free.values()) for (const b of list) b.destroy();
    this.#free.clear();
    this.#freeBytes = 0;
    for (const list of this.#querySets.values()) for (const q of list) q.destroy();
    this.#querySets.clear();
  }

  stats(): PoolStats {
    let free = 0;
    for (const l of this.#free.values()) free += l.length;
    return {
      in_use: this.#inUse.size,
      in_use_bytes: this.#inUseBytes,
      free,
      free_bytes: this.#freeBytes,
      created: this.#created,
      reused: this.#reused,
      query_sets_created: this.#querySetsCreated,
    };
  }
}

const pools = new WeakMap<GPUDevice, BufferPool>();
/** The pools of this thread's devices not lost yet (weakly: a device may go without a loss). */
const live = new Set<WeakRef<BufferPool>>();
/** Buffers created and reused by every pool of {@link poolOf}, lost ones included. */
const counts = { created: 0, reused: 0 };

/**
 * The pool of `ctx`'s device (its cap from `ATTN_GPU_POOL_MAX_FREE_BYTES`, read as the pool is
 * made: a bad value fails that first use of the device with an EnvValueError naming it, and
 * each later one; the server refuses it at start-up, server/serve_env.ts).
 */
export function poolOf(ctx: GpuContext): BufferPool {
  let p = pools.get(ctx.device);
  if (!p) {
    const pool = p = new BufferPool(ctx.device, readSetting(GPU_POOL_CAP_SETTING), counts);
    pools.set(ctx.device, pool);
    const ref = new WeakRef(pool);
    live.add(ref);
    const lost = () => {
      live.delete(ref);
      pool.markLost();
    };
    // A stand-in device without a `lost` promise (tests) is never lost.
    if (ctx instanceof WebGpuContext || ctx.device.lost !== undefined) onDeviceLost(ctx, lost);
  }
  return p;
}

/** What /metrics shows of this thread's GPU buffer pools. */
export interface BufferPoolTotals {
  /** Pools of live devices (one per device this thread uses). */
  pools: number;
  in_use_bytes: number;
  free_bytes: number;
  /** The sum of their caps on free bytes (the cap alone with one device). */
  max_free_bytes: number;
  /** Buffers created and acquires served from a pool, since the process started (counters). */
  created: number;
  reused: number;
}

/** The pools of this thread's live devices, summed ({@link poolOf}'s pools only). */
export function bufferPoolTotals(): BufferPoolTotals {
  const t: BufferPoolTotals = {
    pools: 0,
    in_use_bytes: 0,
    free_bytes: 0,
    max_free_bytes: 0,
    created: counts.created,
    reused: counts.reused,
  };
  for (const ref of live) {
    const p = ref.deref();
    if (!p) {
      live.delete(ref);
      continue;
    }
    const s = p.stats();
    t.pools++;
    t.in_use_bytes += s.in_use_bytes;
    t.free_bytes += s.free_bytes;
    t.max_free_bytes += p.maxFreeBytes;
  }
  return t;
}
