/**
 * Calls on one server-held WebGPU cache overlap: the service hands a cache to the next call
 * once the previous one's GPU work is submitted (service/cache_store.ts), and the device queue
 * keeps their order. A chain of decode steps issued all at once, each attending over the keys
 * the steps before it wrote, must give what the same steps give one at a time on the float64
 * reference, and leave the cache holding every step's key and value.
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { builtinBackends } from "../../backends/index.ts";
import { toFloat32 } from "../../core/data.ts";
import type { ForwardBatch, KvCacheSpec } from "../../core/types.ts";
import { AttentionService } from "../../service/service.ts";
import { hostInput, validHostBatch } from "../../service/host_input.ts";
import { plainLayer } from "../../core/layer.ts";
import { Rng } from "../support/rng.ts";
import { assertClose, assertSameBytes } from "../support/compare.ts";
import { MANAGER } from "../support/gpu.ts";
import { freshSeed, GPU_TEST } from "./helpers.ts";

const H = 4, KVH = 2, D = 64, BS = 16, REQS = 3, STEPS = 20;
const SPEC: KvCacheSpec = {
  num_blocks: 8,
  block_size: BS,
  num_kv_heads: KVH,
  head_size: D,
  dtype: "float16",
  kv_cache_dtype: "float16",
  layout: "NHD",
};

function randoms(rng: Rng, n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = rng.normal();
  return a;
}

/** Step `t` of the chain: every request adds its token `t` and attends over keys 0..t. */
function step(t: number, tables: number[][], rng: Rng): Omit<ForwardBatch, "cache"> {
  const maxBlocks = tables[0].length;
  return {
    dtype: "float16",
    layer: plainLayer({ num_heads: H, num_kv_heads: KVH, head_size: D }),
    num_tokens: REQS,
    query: randoms(rng, REQS * H * D),
    key: randoms(rng, REQS * KVH * D),
    value: randoms(rng, REQS * KVH * D),
    metadata: {
      num_reqs: REQS,
      query_start_loc: Int32Array.from({ length: REQS + 1 }, (_, i) => i),
      seq_lens: new Int32Array(REQS).fill(t + 1),
      block_table: Int32Array.from(tables.flat()),
      max_blocks_per_req: maxBlocks,
      slot_mapping: Int32Array.from(tables, (row) => row[Math.floor(t / BS)] * BS + (t % BS)),
      causal: true,
    } as ForwardBatch["metadata"],
    return_lse: false,
  };
}

Deno.test("pipelined calls on one cache: a decode chain issued at once", GPU_TEST, async () => {
  const seed = freshSeed(), rng = new Rng(seed);
  // Each request's blocks, drawn without repeats from the cache's 8.
  const ids = Array.from({ length: SPEC.num_blocks }, (_, i) => i);
  for (let i = ids.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    [ids[i], ids[j]] = [ids[j], ids[i]];
  }
  const per = Math.ceil(STEPS / BS);
  const tables = Array.from({ length: REQS }, (_, r) => ids.slice(r * per, (r + 1) * per));
  const steps = Array.from({ length: STEPS }, (_, t) => step(t, tables, rng));
  const svc = new AttentionService({
    backends: builtinBackends(),
    device: MANAGER,
    memoryBudgetBytes: 1 << 26,
  });
  try {
    const c = await svc.createCache({ ...SPEC });
    assert.equal(c.storage, "webgpu");
    // All at once: step t+1 is submitted while step t may still be reading back.
    const got = await Promise.all(steps.map((s) => svc.forward(hostInput(s, c.id))));
    const zeros = new Uint8Array(c.bytes / 2);
    const ref = HostKvCache.fromBytes(SPEC, zeros, zeros);
    for (const [t, s] of steps.entries()) {
      const want = await CPU_REFERENCE.run({}, validHostBatch(s, ref), { gpu: null });
      assertClose(toFloat32(got[t].result.output), toFloat32(want.output), {
        atol: 1e-2,
        rtol: 1e-2,
        label: `step ${t} (seed ${seed})`,
      });
    }
    const [x, y] = [await svc.cacheData(c.id), await ref.read()];
    assertSameBytes(x.key, y.key, `key cache after the chain (seed ${seed})`);
    assertSameBytes(x.value, y.value, `value cache after the chain (seed ${seed})`);
  } finally {
    await svc.close();
  }
});
