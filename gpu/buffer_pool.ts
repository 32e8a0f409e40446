/**
 * A per-device pool of GPU buffers in power-of-two size classes (256 B and up), by usage. A
 * call acquires what it needs and releases everything once its readback resolved (the GPU is
 * done with the buffers then), so steady-state calls create no buffers. Free buffers beyond
 * `maxFreeBytes` are destroyed, largest classes first; a device loss drops the pool with the
 * device (pools are keyed by device). Timestamp query sets are pooled the same way, by count.
 * @module
 */
import type { GpuContext } from "../core/types.ts";

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

/** Counters of a pool (tests and /metrics). */
export interface PoolStats {
  /** Buffers handed out and not yet released. */
  in_use: number;
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
  #freeBytes = 0;
  #created = 0;
  #reused = 0;
  #querySets = new Map<number, GPUQuerySet[]>();
  #querySetsCreated = 0;
  #queryCounts = new WeakMap<GPUQuerySet, number>();

  constructor(device: GPUDevice, maxFreeBytes = 2 ** 30) {
    this.device = device;
    this.maxFreeBytes = maxFreeBytes;
  }

  /** A buffer of at least `bytes` (its size is the class) with exactly `usage`. */
  acquire(bytes: number, usage: number, label = "pooled"): GPUBuffer {
    const size = sizeClass(bytes), key = `${usage}:${size}`;
    const list = this.#free.get(key);
    let b = list?.pop();
    if (b) {
      this.#freeBytes -= size;
      this.#reused++;
    } else {
      b = this.device.createBuffer({ label, size, usage });
      this.#created++;
    }
    this.#inUse.set(b, { key, size });
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
    if (list.length < MAX_FREE_QUERY_SETS) list.push(q);
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
      free,
      free_bytes: this.#freeBytes,
      created: this.#created,
      reused: this.#reused,
      query_sets_created: this.#querySetsCreated,
    };
  }
}

const pools = new WeakMap<GPUDevice, BufferPool>();

/** The pool of `ctx`'s device. */
export function poolOf(ctx: GpuContext): BufferPool {
  let p = pools.get(ctx.device);
  if (!p) pools.set(ctx.device, p = new BufferPool(ctx.device));
  return p;
}
