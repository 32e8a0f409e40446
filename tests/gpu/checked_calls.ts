/**
 * A WEBGPU_FLASH call on a GPU cache beside CPU_REFERENCE on a host copy of that cache, with
 * fresh query/key/value on a generated batch's metadata: the output, the LSE and both caches
 * must agree (tests/gpu/launch_reuse_test.ts, tests/gpu/bind_variants_test.ts).
 * @module
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import type { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { toFloat32 } from "../../core/data.ts";
import type {
  AttentionBackend,
  ForwardBatch,
  ForwardResult,
  GpuContext,
} from "../../core/types.ts";
import type { GpuPlan } from "../../gpu/gpu_plan.ts";
import type { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import type { GeneratedBatch } from "../support/batches.ts";
import { assertClose } from "../support/compare.ts";
import { tolerance } from "../support/backend_check.ts";
import { freshSeed, randomArray, rng } from "./helpers.ts";

/** A GPU cache and its host twin, holding the same bytes. */
export interface CachePair {
  gpuCache: GpuKvCache;
  hostCache: HostKvCache;
}

/** A call's fresh data and the reference's result (which wrote the host cache). */
export interface ReferenceCall {
  data: Omit<ForwardBatch, "cache">;
  want: ForwardResult;
}

/** `g`'s batch with fresh query/key/value from `seed`, run by CPU_REFERENCE on the host cache. */
export async function referenceCall(
  g: GeneratedBatch,
  c: CachePair,
  seed = freshSeed(),
): Promise<ReferenceCall> {
  const r = rng(seed), b = g.batch;
  const data: Omit<ForwardBatch, "cache"> = {
    ...b,
    query: randomArray(r, b.query.length),
    key: b.key ? randomArray(r, b.key.length) : null,
    value: b.value ? randomArray(r, b.value.length) : null,
  };
  const want = await CPU_REFERENCE.run({}, validHostBatch(data, c.hostCache), { gpu: null });
  return { data, want };
}

/** WEBGPU_FLASH's `plan` (built for this batch where null) on the GPU cache, checked. */
export async function runChecked(
  gpu: GpuContext,
  plan: GpuPlan | null,
  g: GeneratedBatch,
  c: CachePair,
  call: ReferenceCall,
  what: string,
): Promise<void> {
  const b = WEBGPU_FLASH as AttentionBackend<GpuPlan>;
  const batch = validHostBatch(call.data, c.gpuCache);
  const got = await b.run(plan ?? await b.plan(batch, { gpu }), batch, { gpu });
  try {
    assertClose(toFloat32(got.output), toFloat32(call.want.output), {
      ...tolerance(g.spec),
      label: `output (${what})`,
    });
    assertClose(got.lse!, call.want.lse!, { atol: 2e-4, rtol: 1e-5, label: `lse (${what})` });
  } finally {
    got.release?.();
  }
  const [x, y] = await Promise.all([c.gpuCache.read(), c.hostCache.read()]);
  assert.deepEqual(x.key, y.key, `key cache (${what})`);
  assert.deepEqual(x.value, y.value, `value cache (${what})`);
}
