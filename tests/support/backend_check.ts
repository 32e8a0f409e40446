/**
 * The shared numeric check of a GPU backend against CPU_REFERENCE on one fresh random batch
 * ({@link checkBackend}): both run the same validated batch (service/host_input.ts), the
 * output comes back in the batch dtype, has no non-finite element and matches within the
 * dtype's tolerance, the LSE too when asked, and the cache after the call holds the
 * reference's bytes exactly.
 * @module
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { toFloat32 } from "../../core/data.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { AttentionBackend, GpuContext, KvCache, PlanContract } from "../../core/types.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch } from "./batches.ts";
import { assertClose, firstNonFinite } from "./compare.ts";
import { chunkedCtx, freshSeed } from "../gpu/helpers.ts";

/** Output tolerance of a batch spec. */
export function tolerance(s: BatchSpec): { atol: number; rtol: number } {
  if (["fp8", "fp8_e4m3", "fp8_e5m2"].includes(s.kv_cache_dtype)) {
    // Both sides read the same fp8 values; the slack covers the output dtype's rounding.
    return s.dtype === "float32" ? { atol: 1e-4, rtol: 1e-4 } : { atol: 6e-2, rtol: 1e-1 };
  }
  return s.dtype === "float32" ? { atol: 1e-4, rtol: 1e-5 } : { atol: 1e-2, rtol: 1e-2 };
}

/** Options of {@link checkBackend}. */
export interface CheckOptions {
  /** Cap cache chunks at this many blocks (a multi-chunk cache). */
  maxBlocksPerChunk?: number;
  /** Fewest decode work items the plan must cut (proves the split path ran). */
  minItems?: number;
  /** The plan's kernel keys must match (proves which variant ran). */
  kernels?: RegExp;
}

/** Runs `backend` and the reference on a fresh batch of `s` and compares (see the module doc). */
export async function checkBackend(
  backend: AttentionBackend,
  gpu: GpuContext,
  s: BatchSpec,
  o: CheckOptions = {},
): Promise<void> {
  const seed = freshSeed();
  const g = generateBatch(s, seed);
  let ref: KvCache | null = null, cache: GpuKvCache | null = null;
  if (g.cache_spec) {
    const blockBytes = g.key_cache.byteLength / g.cache_spec.num_blocks;
    if (o.maxBlocksPerChunk) gpu = chunkedCtx(gpu, o.maxBlocksPerChunk, blockBytes);
    ref = HostKvCache.fromBytes(g.cache_spec, g.key_cache, g.value_cache);
    cache = await GpuKvCache.fromBytes(gpu, g.cache_spec, g.key_cache, g.value_cache);
    if (o.maxBlocksPerChunk) assert.ok(cache.geometry.nchunk > 1, "a multi-chunk cache");
  }
  const ctx = { gpu };
  try {
    const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, ref), { gpu: null });
    const batch = validHostBatch(g.batch, cache);
    const plan = await backend.plan(batch, ctx) as PlanContract & {
      kernels?: string[];
      info?: Record<string, number>;
    };
    const items = plan.info?.decode_items ?? 0;
    const what = `${plan.kernels?.join(" + ")}, ${items} slices, seed ${seed}`;
    if (o.minItems) assert.ok(items >= o.minItems, `${items} slices (${what})`);
    if (o.kernels) assert.match(plan.kernels?.join(" + ") ?? "", o.kernels, what);
    let got;
    try {
      got = await backend.run(plan, batch, ctx);
    } finally {
      backend.disposePlan?.(plan);
    }
    assert.equal(got.output.dtype, s.dtype, `output dtype (${what})`);
    const out = toFloat32(got.output);
    assert.equal(firstNonFinite(out), -1, `output has a non-finite element (${what})`);
    assertClose(out, toFloat32(want.output), {
      ...tolerance(s),
      shape: g.output_shape,
      label: `output (${what})`,
    });
    if (s.return_lse) {
      assert.ok(got.lse && want.lse);
      assertClose(got.lse, want.lse, { atol: 2e-4, rtol: 1e-5, label: `lse (${what})` });
    } else assert.equal(got.lse, null);
    if (ref && cache) {
      const [a, b] = await Promise.all([cache.read(), ref.read()]);
      assert.deepEqual(a.key, b.key, `key cache after the call (seed ${seed})`);
      assert.deepEqual(a.value, b.value, `value cache after the call (seed ${seed})`);
    }
  } finally {
    cache?.destroy();
  }
}
