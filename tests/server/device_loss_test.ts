/**
 * Device loss over HTTP with the real WebGPU device (destroyed in the test), on the suite's
 * runtime (`ATTN_WEBGPU_RUNTIME`, tests/support/gpu.ts): calls on a GPU cache that lived on it
 * answer 503 with Retry-After, the cache is reported lost (never served as garbage), the plans
 * built on the lost device are dropped at once, the device is re-acquired with the next
 * generation, and a new cache on it works (with a plan of its own) and matches the float64
 * reference. Skipped without an adapter.
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import type { AttentionBackend } from "../../core/types.ts";
import type { ForwardBody } from "../../client/client.ts";
import { maxAbsDiff, rand, refAttention, startServer, to3d } from "./helpers.ts";
import { NO_GPU } from "../gpu/helpers.ts";
import { newManager } from "../support/gpu.ts";

const H = 2, Hkv = 1, D = 64;

function step(cache: string, kv: { k: number[]; v: number[] }, q: number[]): ForwardBody {
  return {
    backend: "WEBGPU_FLASH",
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: Hkv, head_size: D },
    query: { dtype: "float32", shape: [1, H, D], data: q },
    key: { dtype: "float32", shape: [1, Hkv, D], data: kv.k },
    value: { dtype: "float32", shape: [1, Hkv, D], data: kv.v },
    metadata: { query_start_loc: [0, 1], seq_lens: [1], block_table: [[0]], slot_mapping: [0] },
    kv_cache: cache,
  };
}

Deno.test({
  name: "device loss: 503 with Retry-After, caches reported lost, re-acquired",
  ignore: NO_GPU,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const device = newManager();
  const gpu = await device.acquire();
  const srv = await startServer({ device, backends: builtinBackends() as AttentionBackend[] });
  try {
    const spec = { num_blocks: 4, block_size: 16, num_kv_heads: Hkv, head_size: D };
    const c = await srv.client.createCache({ ...spec, dtype: "float32" });
    const kv = { k: rand(D), v: rand(D) }, q = rand(H * D);
    await srv.client.forward(step(c.id, kv, q));
    const plans = srv.service.plans;
    assert.equal(plans.stats().size, 1, "the call's plan is cached");
    const lost = new Promise((r) => gpu!.device.lost.then(r));
    gpu!.device.destroy();
    await lost;
    await new Promise((r) => setTimeout(r, 0));
    // Plans hold the dead device's buffers and table memory: dropped with it, not left to LRU.
    assert.equal(plans.stats().size, 0, "the lost device's plans are dropped");
    assert.equal(plans.stats().disposed, 1, "and disposed");
    const res = await fetch(`${srv.url}/v1/attention/forward`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(step(c.id, kv, q)),
    });
    const doc = await res.json();
    assert.equal(res.status, 503, JSON.stringify(doc));
    assert.ok(res.headers.get("retry-after"), "Retry-After on a 503");
    assert.match(doc.detail, /lost/);
    assert.equal((await srv.client.getCache(c.id)).lost, true, "the cache is reported lost");
    const data = await fetch(`${srv.url}/v1/kv-caches/${c.id}/data`);
    assert.equal(data.status, 503, "a lost cache's contents are not served");
    await data.body?.cancel();
    // A new cache re-acquires the device (generation 2) and computes the right answer.
    const c2 = await srv.client.createCache({ ...spec, dtype: "float32" });
    assert.equal(device.report().generation, 2);
    const ans = await srv.client.forward(step(c2.id, kv, q));
    const want = refAttention({
      q: to3d(q, 1, H, D),
      k: to3d(kv.k, 1, Hkv, D),
      v: to3d(kv.v, 1, Hkv, D),
    });
    assert.ok(maxAbsDiff(ans.output.values, want.out.flat(2)) < 1e-5);
    assert.equal(plans.stats().size, 1, "the new device got a plan of its own");
    assert.equal(plans.stats().hits, 0);
  } finally {
    await srv.close();
    device.close();
  }
});
