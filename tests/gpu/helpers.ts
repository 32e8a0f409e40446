/**
 * Shared setup of the GPU tests: the shared device of the runtime named by
 * `ATTN_WEBGPU_RUNTIME` (tests/support/gpu.ts), the `ignore` flag when there is no adapter,
 * and seeded random data.
 * @module
 */
import type { GpuContext, KvCacheDType } from "../../core/types.ts";
import { MAX_KV_CHUNK_BYTES } from "../../gpu/kv_cache.ts";
export { GPU, gpu, NO_GPU, NO_GPU_REASON } from "../support/gpu.ts";
export { freshSeed } from "../support/rng.ts";
import { NO_GPU } from "../support/gpu.ts";

/** Deno.test options of a GPU test: skipped without a device; the device outlives the test. */
export const GPU_TEST = { ignore: NO_GPU, sanitizeResources: false, sanitizeOps: false };

/** A seeded PRNG (mulberry32) in [0, 1). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** `n` values uniform in [-scale, scale). */
export function randomArray(r: () => number, n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (r() * 2 - 1) * scale;
  return a;
}

/**
 * `ctx` with cache chunks capped at `blocks` blocks of `blockBytes` (see MAX_KV_CHUNK_BYTES):
 * caches created and plans built with it use several chunk buffers.
 */
export function chunkedCtx(ctx: GpuContext, blocks: number, blockBytes: number): GpuContext {
  return { ...ctx, limits: { ...ctx.limits, [MAX_KV_CHUNK_BYTES]: blocks * blockBytes } };
}

/** The cache writes the write tests run: every storage dtype, each from a different data dtype. */
export const CACHE_WRITE_CASES: readonly [KvCacheDType, "float32" | "float16" | "bfloat16"][] = [
  ["auto", "float32"],
  ["float16", "float32"],
  ["bfloat16", "float16"],
  ["fp8_e4m3", "bfloat16"],
  ["fp8_e5m2", "float32"],
];
