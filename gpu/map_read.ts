/**
 * Reading a mapped buffer back as soon as the GPU is done, without Deno's 10 ms sleep.
 *
 * Deno's `mapAsync` (ext/webgpu/buffer.rs, 2.9) joins two futures: a loop of
 * `device_poll(wait)` then a 10 ms sleep until the map's callback has fired, and the callback's
 * receiver. Deno polls the op once when it is called, so the first `device_poll(wait)` runs
 * inside the `mapAsync` call: it blocks until the queue is idle and fires the map's callback,
 * and wgpu has the buffer mapped before `mapAsync` returns. Only the promise waits out the
 * sleep. `getMappedRange` asks wgpu, not the promise, so the range is readable at once
 * (measured on lavapipe: the data read 0.3-0.5 ms after the submit against 11.9 ms awaited).
 *
 * Two guards keep this safe:
 * - a buffer is read early only after one map of it completed the awaited way (its map mode is
 *   then known to Deno; before that, Deno's `getMappedRange` would panic);
 * - a range that is not mapped yet (the poll did not run in the call, or another version
 *   behaves otherwise) throws, and the read falls back to awaiting the promise.
 *
 * It is on for devices of Deno's own runtime at the versions it was checked on
 * ({@link earlyReadDefault}); `ATTN_EARLY_READ=0` turns it off, `1` turns it on for any
 * version. Dawn's `mapAsync` resolves when its callback fires, so Dawn never needs it.
 * The range Deno's `getMappedRange` returns is its own copy (`to_vec` into a V8 buffer), which
 * `unmap` detaches: {@link ownsMappedCopies} says a caller may move it out with `transfer()` and
 * keep it, instead of copying it again (gpu/launch.ts).
 * The promise left behind resolves ~10 ms later and is kept from rejecting unhandled;
 * {@link settleEarlyReads} awaits them (tests). When it resolves, Deno marks the buffer's
 * `mapState` "mapped" although it was unmapped long before (and a buffer mapped early reads
 * "pending"): on such a device `mapState` is not to be trusted, and nothing here reads it.
 * @module
 */
import { type EnvSetting, readSetting, switchSetting } from "../core/env.ts";

const EARLY = new WeakSet<GPUDevice>();
const DEFER = new WeakSet<GPUDevice>();
const OWNED = new WeakSet<GPUDevice>();
const PRIMED = new WeakSet<GPUBuffer>();
const pending = new Set<Promise<unknown>>();
/** Each device's deferred reads not mapped yet, by the functions that map them. */
const WAITING = new WeakMap<GPUDevice, Set<() => unknown>>();

/**
 * Counts of reads (`/metrics`: `attn_gpu_readback_*_total`; tests): `early` and `awaited` by how
 * {@link mapReadRange} completed them; `deferred`, reads of primed buffers that waited a turn for
 * other calls' host work first ({@link mapReadRangeDeferred}; each then counts as early, or as
 * awaited where its range was not mapped yet), and `by_submit`, those of them another call's
 * launch mapped ({@link mapDeferredReads}).
 */
export const mapReadCounts = { early: 0, awaited: 0, deferred: 0, by_submit: 0 };

/**
 * The Deno versions checked: 2.9.0-2.9.5 by their source (ext/webgpu/buffer.rs: `mapAsync` polls
 * within the call; a read range is a `to_vec` copy; the map mode is never cleared), 2.9.6 by
 * running (this project's pin). A later version reads the awaited way until checked.
 */
const CHECKED_DENO = /^2\.9\.[0-6]$/;

/** `ATTN_EARLY_READ`: 0 never, 1 on Deno's runtime whatever its version; unset: checked ones. */
export const EARLY_READ_SETTING: EnvSetting<boolean | null> = switchSetting(
  "ATTN_EARLY_READ",
  null,
);

/**
 * `ATTN_DEFER_READ`: 0 maps a call's read-back right after its submit; 1 or unset, on a device
 * that reads early, first lets the calls waiting for the thread run ({@link mapReadRangeDeferred}).
 */
export const DEFER_READ_SETTING: EnvSetting<boolean | null> = switchSetting(
  "ATTN_DEFER_READ",
  null,
);

/** Whether Deno's runtime `version` reads early when `ATTN_EARLY_READ` is unset. */
export function earlyReadDefault(version: string): boolean {
  return CHECKED_DENO.test(version);
}

/**
 * Marks a device of Deno's own runtime (at `version`): its read ranges are owned copies
 * ({@link ownsMappedCopies}) at the checked versions, and its buffers are read early as
 * `ATTN_EARLY_READ` and the version allow. Returns whether they are read early.
 */
export function markDenoDevice(device: GPUDevice, version: string): boolean {
  const set = readSetting(EARLY_READ_SETTING);
  const checked = earlyReadDefault(version);
  if (checked) OWNED.add(device);
  const on = set ?? checked;
  const defer = readSetting(DEFER_READ_SETTING) ?? true;
  if (on) EARLY.add(device);
  if (on && defer) DEFER.add(device);
  return on;
}

/** Whether `device`'s reads wait for other calls' host work first ({@link mapReadRangeDeferred}). */
export function defersReads(device: GPUDevice): boolean {
  return DEFER.has(device);
}

/**
 * Whether `device`'s `getMappedRange` hands out the runtime's own copy of the range, which
 * stays valid once moved out (`ArrayBuffer.prototype.transfer`) before `unmap` detaches it:
 * Deno 2.9.0-2.9.6's does (`slice.to_vec()` into a V8 backing store), whatever `ATTN_EARLY_READ`
 * says.
 * Dawn's ranges are the mapping itself.
 */
export function ownsMappedCopies(device: GPUDevice): boolean {
  return OWNED.has(device);
}

/** Whether `device`'s buffers are read early. */
export function readsEarly(device: GPUDevice): boolean {
  return EARLY.has(device);
}

function rangeNow(buffer: GPUBuffer, offset: number, size: number): ArrayBuffer | null {
  try {
    return buffer.getMappedRange(offset, size);
  } catch {
    return null; // not mapped yet: wait for the promise
  }
}

/**
 * Maps `buffer` for reading and returns its range `[offset, offset + size)`; the caller
 * copies what it needs and unmaps. On a device that reads early, a buffer mapped once before
 * is read as soon as `mapAsync` returns (see the module doc).
 */
export async function mapReadRange(
  device: GPUDevice,
  buffer: GPUBuffer,
  offset: number,
  size: number,
): Promise<ArrayBuffer> {
  const mapped = buffer.mapAsync(GPUMapMode.READ);
  if (EARLY.has(device) && PRIMED.has(buffer)) {
    const range = rangeNow(buffer, offset, size);
    if (range) {
      const late = mapped.catch(() => undefined).finally(() => pending.delete(late));
      pending.add(late);
      mapReadCounts.early++;
      return range;
    }
  }
  await mapped;
  PRIMED.add(buffer);
  mapReadCounts.awaited++;
  return buffer.getMappedRange(offset, size);
}

/** The host's next turn after pending I/O (setImmediate: no timer clamp), or now without it. */
const realImmediate = (globalThis as { setImmediate?: (f: () => void) => unknown }).setImmediate;
const nextTurn = (): Promise<void> =>
  new Promise((resolve) => realImmediate ? realImmediate.call(globalThis, resolve) : resolve());

/**
 * {@link mapReadRange} after the thread's other ready work, on a device that defers reads
 * ({@link defersReads}; else at once). Deno's `mapAsync` blocks the JS thread until the GPU is
 * idle, so a call that maps right after its submit holds every other call's parsing, planning
 * and encoding for its GPU time. Deferred, the read waits one turn of the event loop; the calls
 * that run meanwhile map it before their own launch ({@link mapDeferredReads}), when its GPU
 * work is most likely done (their host work takes longer than a step's kernels), so that map
 * returns at once and the GPU works while the host does. A call alone loses nothing: its turn
 * passes while its kernels run. A buffer not primed yet is mapped at once (its first map is
 * awaited anyway).
 */
export async function mapReadRangeDeferred(
  device: GPUDevice,
  buffer: GPUBuffer,
  offset: number,
  size: number,
): Promise<ArrayBuffer> {
  if (!DEFER.has(device) || !PRIMED.has(buffer)) return mapReadRange(device, buffer, offset, size);
  let read: Promise<ArrayBuffer> | undefined;
  const start = () => {
    if (!read) {
      read = mapReadRange(device, buffer, offset, size);
      read.catch(() => undefined); // its owner awaits it below
    }
    return read;
  };
  let waiting = WAITING.get(device);
  if (!waiting) WAITING.set(device, waiting = new Set());
  waiting.add(start);
  mapReadCounts.deferred++;
  try {
    await nextTurn();
  } finally {
    waiting.delete(start);
  }
  return await start();
}

/**
 * Maps every deferred read of `device` now (a launch calls it before its uploads and submit,
 * outside its error scope, so that those reads do not wait for its kernels too).
 */
export function mapDeferredReads(device: GPUDevice): void {
  const waiting = WAITING.get(device);
  if (!waiting?.size) return;
  for (const start of [...waiting]) {
    waiting.delete(start);
    mapReadCounts.by_submit++;
    start();
  }
}

/** Resolves once every promise left by an early read has settled. */
export async function settleEarlyReads(): Promise<void> {
  while (pending.size) await Promise.all([...pending]);
}
