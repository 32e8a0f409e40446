/**
 * The device request, the same on every runtime: every limit at the adapter's own value, and
 * the optional features the kernels can use when the adapter offers them.
 * @module
 */
import { wakeDawnPoll } from "./dawn_tick_pace.ts";
import { mapReadRange } from "./map_read.ts";

/** Optional features requested when the adapter offers them. */
export const WANTED_FEATURES = [
  "shader-f16",
  "timestamp-query",
  "chromium-experimental-subgroup-matrix",
] as const;

/**
 * Requested even when the adapter does not list it (Deno hides `subgroups` from
 * `adapter.features` on some backends yet grants it); the request is retried without it.
 */
export const OPPORTUNISTIC_FEATURES = ["subgroups"] as const;

/** Every numeric entry of a GPUSupportedLimits (own and prototype getters). */
export function numericLimits(l: GPUSupportedLimits): Record<string, number> {
  const out: Record<string, number> = {};
  const keys = new Set<string>(Object.keys(l));
  for (
    let p = Object.getPrototypeOf(l);
    p && p !== Object.prototype;
    p = Object.getPrototypeOf(p)
  ) {
    for (const k of Object.getOwnPropertyNames(p)) keys.add(k);
  }
  for (const k of keys) {
    if (k === "constructor") continue;
    const v = (l as unknown as Record<string, unknown>)[k];
    if (typeof v === "number" && Number.isFinite(v)) out[k] = v;
  }
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => a.localeCompare(b)));
}

/**
 * Requests a device with every limit at the adapter's value and the wanted features it offers
 * (plus `subgroups` even unlisted, retried without). Returns the device or why it failed.
 */
export async function requestFullDevice(
  adapter: GPUAdapter,
  label: string,
): Promise<GPUDevice | string> {
  const requiredLimits = numericLimits(adapter.limits);
  const offered = new Set<string>([...adapter.features]);
  const listed: string[] = WANTED_FEATURES.filter((f) => offered.has(f));
  const attempts = [
    [...listed, ...OPPORTUNISTIC_FEATURES],
    [...listed, ...OPPORTUNISTIC_FEATURES.filter((f) => offered.has(f))],
  ];
  if (attempts[1].length === attempts[0].length) attempts.pop();
  let lastErr: unknown = null;
  for (const features of attempts) {
    try {
      return await adapter.requestDevice({
        requiredFeatures: features as GPUFeatureName[],
        requiredLimits,
        label,
      });
    } catch (e) {
      lastErr = e;
    }
  }
  return `requestDevice failed: ${lastErr instanceof Error ? lastErr.message : lastErr}`;
}

/**
 * Runs `f` with the round-trip probes' buffers: a 16-byte map-read `staging` buffer (labelled
 * `label`) and a 16-byte copy source; destroys both after.
 */
async function withProbeBuffers<T>(
  device: GPUDevice,
  label: string,
  f: (staging: GPUBuffer, src: GPUBuffer) => Promise<T>,
): Promise<T> {
  const usage = GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST;
  const staging = device.createBuffer({ size: 16, usage, label });
  const src = device.createBuffer({
    size: 16,
    usage: GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  try {
    return await f(staging, src);
  } finally {
    staging.destroy();
    src.destroy();
  }
}

/** Submits a copy of `src`'s 16 bytes into `staging`. */
function copy16(device: GPUDevice, src: GPUBuffer, staging: GPUBuffer): void {
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(src, 0, staging, 0, 16);
  device.queue.submit([enc.finish()]);
}

/**
 * The read-back round trip as forward calls pay it (gpu/map_read.ts: as soon as the GPU is done
 * on Deno's runtime, its first read of the buffer awaited): a 16-byte copy, then a read of it,
 * `iters` times after one priming read. Returns each time in ms.
 */
export function readRoundTrip(device: GPUDevice, iters: number): Promise<number[]> {
  return withProbeBuffers(device, "read-round-trip", async (staging, src) => {
    const ms: number[] = [];
    for (let i = 0; i <= iters; i++) {
      const t = performance.now();
      copy16(device, src, staging);
      wakeDawnPoll();
      await mapReadRange(device, staging, 0, 16);
      staging.unmap();
      if (i > 0) ms.push(performance.now() - t); // the first primes the buffer
    }
    return ms;
  });
}

/**
 * The completion round trip of a runtime: an empty submit, then mapAsync of a 16-byte buffer
 * (which waits for the queue), `iters` times. Returns each time in ms and the words read
 * (the buffer holds 1, 2, 3, 4 written by writeBuffer before the first map).
 */
export function completionRoundTrip(
  device: GPUDevice,
  iters: number,
): Promise<{ ms: number[]; words: number[] }> {
  return withProbeBuffers(device, "round-trip", async (staging, src) => {
    device.queue.writeBuffer(src, 0, new Uint32Array([1, 2, 3, 4]));
    copy16(device, src, staging);
    const ms: number[] = [];
    let words: number[] = [];
    for (let i = 0; i < iters; i++) {
      const t = performance.now();
      device.queue.submit([]);
      wakeDawnPoll();
      await staging.mapAsync(GPUMapMode.READ);
      ms.push(performance.now() - t);
      if (i === 0) words = [...new Uint32Array(staging.getMappedRange().slice(0))];
      staging.unmap();
    }
    return { ms, words };
  });
}
