/**
 * Large uploads through staging buffers the service keeps mapped between calls. Dawn's
 * `queue.writeBuffer` stages any write over 4 MiB in a buffer it creates for that write alone
 * (mapped at creation, destroyed once the copy ran: src/dawn/native/DynamicUploader.cpp), so a
 * 4 x 2048 prefill's 100 MB of query/key/value costs three fresh host-visible allocations per
 * call. Here each such upload is copied into a pooled MAP_WRITE | COPY_SRC buffer that is
 * already mapped, unmapped, and copied on the GPU by the call's own encoder; once the call's
 * readback resolved (the GPU is done with it) the buffer is mapped again in the background
 * and goes back to the pool. A call that finds none mapped waits for one being mapped, or
 * creates one mapped at creation.
 *
 * Used for uploads of at least {@link STAGED_UPLOAD_BYTES} on a hardware adapter under Dawn,
 * or wherever `ATTN_UPLOAD_STAGING=1` (`=0`: never). Measured on lavapipe under Dawn (a 2-core
 * VM), it does not pay: there Dawn's allocations are malloc'd memory that glibc recycles, so
 * writeBuffer's 100 MB take ~9 ms, and staging adds the wait for the buffers' re-mapping
 * (0.5-7 ms: Dawn settles maps on its event-loop poll). Where a host-visible allocation is
 * costly (pinned memory on a discrete GPU) it does: 36 -> 12.3 ms for 100 MB on the H200.
 * Deno's own runtime keeps it off (its `mapAsync` waits out a 10 ms poll on the JS thread).
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { sizeClass } from "./buffer_pool.ts";
import { isSoftwareAdapter } from "./runtime_adapter.ts";
import { type EnvSetting, readSetting, switchSetting } from "../core/env.ts";

/** Uploads at least this large are staged (Dawn's ring buffer is 4 MiB). */
export const STAGED_UPLOAD_BYTES = 4 << 20;

const USAGE = GPUBufferUsage.MAP_WRITE | GPUBufferUsage.COPY_SRC;

/** Most bytes of mapped staging buffers kept. */
const MAX_KEPT_BYTES = 1 << 30;

/** `ATTN_UPLOAD_STAGING`: 1 stages large uploads on any adapter, 0 never; unset: the default. */
export const UPLOAD_STAGING_SETTING: EnvSetting<boolean | null> = switchSetting(
  "ATTN_UPLOAD_STAGING",
  null,
);

let forced: boolean | null = null;

/** Forces staging on or off (null: `ATTN_UPLOAD_STAGING`, then the default); for tests and benches. */
export function forceStagedUploads(on: boolean | null): void {
  forced = on;
}

/**
 * Whether `ctx`'s large uploads are staged (see the module doc).
 * @throws EnvValueError naming `ATTN_UPLOAD_STAGING` and its value when it is neither 0 nor 1.
 */
export function stagedUploads(ctx: GpuContext): boolean {
  return forced ?? readSetting(UPLOAD_STAGING_SETTING) ?? stagesByDefault(ctx);
}

/**
 * On by default for a hardware adapter under Dawn: on the H200 a 4 x 2048 prefill's 100 MB of
 * q/k/v took 36 ms through writeBuffer and 12.3 ms through kept staging buffers
 * (bench/host_profile.ts, bench/NOTES.md). Off under Deno's own runtime (its device objects
 * are Deno's `GPUDevice`; each re-map waits out its 10 ms poll) and on software adapters (no
 * gain on lavapipe).
 */
function stagesByDefault(ctx: GpuContext): boolean {
  const denoRuntime = typeof GPUDevice !== "undefined" && ctx.device instanceof GPUDevice;
  return !denoRuntime && !isSoftwareAdapter(ctx.adapter_info);
}

/** Counters (tests and the profile). */
export interface StagingStats {
  created: number;
  reused: number;
  /** Acquires that waited for a buffer being mapped again. */
  waited: number;
}

/** The mapped staging buffers of one device. */
export class StagingPool {
  readonly device: GPUDevice;
  #ready = new Map<number, GPUBuffer[]>();
  #mapping = new Map<number, Promise<GPUBuffer | null>[]>();
  #keptBytes = 0;
  #created = 0;
  #reused = 0;
  #waited = 0;

  constructor(device: GPUDevice) {
    this.device = device;
  }

  /** A mapped buffer of at least `bytes` (the caller writes, unmaps, copies, then recycles). */
  async acquire(bytes: number): Promise<GPUBuffer> {
    const size = sizeClass(bytes);
    for (;;) {
      const b = this.#ready.get(size)?.pop();
      if (b) {
        this.#keptBytes -= size;
        this.#reused++;
        return b;
      }
      const pending = this.#mapping.get(size)?.shift();
      if (!pending) break;
      this.#waited++;
      const mapped = await pending;
      if (mapped) {
        this.#keptBytes -= size;
        this.#reused++;
        return mapped;
      }
    }
    this.#created++;
    return this.device.createBuffer({
      label: "upload.staging",
      size,
      usage: USAGE,
      mappedAtCreation: true,
    });
  }

  /**
   * Takes back a buffer the GPU is done with: mapped again in the background, then handed out
   * again (or destroyed past the kept limit, or when mapping fails).
   */
  recycle(b: GPUBuffer): void {
    const size = b.size;
    if (this.#keptBytes + size > MAX_KEPT_BYTES) {
      b.destroy();
      return;
    }
    this.#keptBytes += size;
    let list = this.#mapping.get(size);
    if (!list) this.#mapping.set(size, list = []);
    const p: Promise<GPUBuffer | null> = b.mapAsync(GPUMapMode.WRITE).then(
      () => {
        const l = this.#mapping.get(size);
        const i = l?.indexOf(p) ?? -1;
        if (i < 0) return b; // an acquire is waiting for it and takes it
        l!.splice(i, 1);
        let ready = this.#ready.get(size);
        if (!ready) this.#ready.set(size, ready = []);
        ready.push(b);
        return b;
      },
      () => {
        const l = this.#mapping.get(size);
        const i = l?.indexOf(p) ?? -1;
        if (i >= 0) l!.splice(i, 1);
        this.#keptBytes -= size;
        b.destroy();
        return null;
      },
    );
    list.push(p);
  }

  stats(): StagingStats {
    return { created: this.#created, reused: this.#reused, waited: this.#waited };
  }
}

const pools = new WeakMap<GPUDevice, StagingPool>();

/** The staging pool of `ctx`'s device. */
export function stagingOf(ctx: GpuContext): StagingPool {
  let p = pools.get(ctx.device);
  if (!p) pools.set(ctx.device, p = new StagingPool(ctx.device));
  return p;
}
