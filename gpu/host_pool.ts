/**
 * A pool of host memory for read-back results, in power-of-two size classes (4 KiB and up),
 * like the GPU buffer pool (gpu/buffer_pool.ts). Copying a large readback into fresh memory
 * pays a page fault per 4 KiB page (on the H200 host a 64 MiB copy took 42.5 ms into a fresh
 * ArrayBuffer and 11.2 ms into memory already touched, bench/io_probe.ts), so a launch copies
 * its mapped range into a lent, already-touched buffer instead ({@link HostLease}).
 *
 * A lease is owned by one result until `release()`: the pool never lends memory that is out on
 * a lease, so two live results never share bytes. Whoever consumes the result releases it once
 * nothing reads its bytes any more (the HTTP layer once the body was delivered, the service's
 * callers when done); a lease that is never released is simply not reused (its memory goes
 * with the garbage collector; `leaked` counts those the collector found). Free buffers beyond
 * `maxFreeBytes` are dropped, largest classes first.
 *
 * Memory: the free buffers (at most `maxFreeBytes`, default 1 GiB, `ATTN_HOST_POOL_MAX_FREE_BYTES`)
 * and those out on leases are outside `--memory-budget-bytes`, which counts KV caches only; the
 * pool is per thread (each device thread has its own). /metrics shows them:
 * `attn_host_pool_{free,in_use,max_free}_bytes` and the buffers created, reused and leaked
 * (server/metrics_pools.ts).
 * @module
 */
import { DEFAULT_POOL_MAX_FREE_BYTES, poolCapSetting, sizeClass } from "./buffer_pool.ts";
import { type EnvSetting, readSetting } from "../core/env.ts";

/** The environment variable capping the free bytes of {@link hostPool}. */
export const HOST_POOL_CAP_ENV = "ATTN_HOST_POOL_MAX_FREE_BYTES";

/** Smallest size class, bytes. */
export const MIN_HOST_CLASS = 4096;

/** Host memory lent to one result. */
export interface HostLease {
  /** `bytes` long, at offset 0 of a pooled ArrayBuffer (the class's size). */
  readonly bytes: Uint8Array<ArrayBuffer>;
  /** Returns the memory to the pool; nothing may read `bytes` afterwards. Idempotent. */
  release(): void;
}

/** Counters of a pool (tests, the bench's reuse line). */
export interface HostPoolStats {
  /** Leases out and not yet released (nor collected). */
  in_use: number;
  /** Bytes of the buffers out on leases (their size classes). */
  in_use_bytes: number;
  free: number;
  free_bytes: number;
  /** Buffers ever allocated (a steady state stops growing this). */
  created: number;
  /** Leases served from the pool. */
  reused: number;
  /** Leases the garbage collector found unreleased. */
  leaked: number;
}

/** A host-memory pool (see the module doc). */
export class HostPool {
  #cap: number | undefined;
  #readCap: () => number;
  #free = new Map<number, ArrayBuffer[]>();
  #freeBytes = 0;
  #inUse = 0;
  #inUseBytes = 0;
  #created = 0;
  #reused = 0;
  #leaked = 0;
  // Watches each lent buffer: collected while out on a lease means nobody released it.
  #unreleased = new FinalizationRegistry<{ done: boolean; size: number }>((state) => {
    if (state.done) return;
    state.done = true;
    this.#inUse--;
    this.#inUseBytes -= state.size;
    this.#leaked++;
  });

  /** `maxFreeBytes`: the cap, or how to read it (once, at the first acquire or look). */
  constructor(maxFreeBytes: number | (() => number) = DEFAULT_POOL_MAX_FREE_BYTES) {
    this.#readCap = typeof maxFreeBytes === "number" ? () => maxFreeBytes : maxFreeBytes;
  }

  /** The cap on free bytes (read now where it was not yet: what the reader throws). */
  get maxFreeBytes(): number {
    return this.#cap ??= this.#readCap();
  }

  /** A lease of `bytes` bytes (contents unspecified: stale bytes of an earlier lease). */
  acquire(bytes: number): HostLease {
    this.#cap ??= this.#readCap(); // before anything is lent: a release never reads it first
    const size = sizeClass(bytes, MIN_HOST_CLASS);
    let buf = this.#free.get(size)?.pop();
    if (buf) {
      this.#freeBytes -= size;
      this.#reused++;
    } else {
      buf = new ArrayBuffer(size);
      this.#created++;
    }
    this.#inUse++;
    this.#inUseBytes += size;
    const state = { done: false, size };
    const owned = buf;
    const lease: HostLease = {
      bytes: new Uint8Array(owned, 0, bytes),
      release: () => {
        if (state.done) return;
        state.done = true;
        this.#inUse--;
        this.#inUseBytes -= size;
        this.#unreleased.unregister(state);
        this.#put(owned);
      },
    };
    this.#unreleased.register(owned, state, state);
    return lease;
  }

  #put(buf: ArrayBuffer): void {
    if (buf.detached || buf.byteLength === 0) return; // transferred away: nothing to keep
    let list = this.#free.get(buf.byteLength);
    if (!list) this.#free.set(buf.byteLength, list = []);
    list.push(buf);
    this.#freeBytes += buf.byteLength;
    if (this.#freeBytes <= this.maxFreeBytes) return;
    const sizes = [...this.#free.keys()].sort((a, b) => b - a);
    for (const s of sizes) {
      const l = this.#free.get(s)!;
      while (l.length && this.#freeBytes > this.maxFreeBytes) {
        l.pop();
        this.#freeBytes -= s;
      }
    }
  }

  /** Drops every free buffer. */
  clear(): void {
    this.#free.clear();
    this.#freeBytes = 0;
  }

  stats(): HostPoolStats {
    let free = 0;
    for (const l of this.#free.values()) free += l.length;
    return {
      in_use: this.#inUse,
      in_use_bytes: this.#inUseBytes,
      free,
      free_bytes: this.#freeBytes,
      created: this.#created,
      reused: this.#reused,
      leaked: this.#leaked,
    };
  }
}

/** Its rule (gpu/buffer_pool.ts {@link poolCapSetting}). */
export const HOST_POOL_CAP_SETTING: EnvSetting<number> = poolCapSetting(HOST_POOL_CAP_ENV);

/**
 * The thread's pool of read-back memory (host memory is not per device; each device thread, a
 * worker, has its own), capped by `ATTN_HOST_POOL_MAX_FREE_BYTES` (default 1 GiB), read at its
 * first acquire, not as this module loads: a bad value fails that read-back with an
 * EnvValueError naming it, and each later one (the server refuses it at start-up,
 * server/serve_env.ts).
 */
export const hostPool: HostPool = new HostPool(() => readSetting(HOST_POOL_CAP_SETTING));
