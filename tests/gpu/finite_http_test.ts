/**
 * A decode step large enough for the device's NaN/infinity check (core/data.ts
 * deviceFiniteCheckBytes(); gpu/finite_check.ts) over a real port, safetensors both ways, on
 * a server-held WebGPU cache: a NaN or infinity in the query, key or value is a 422
 * `invalid_batch` problem naming the tensor and the element, the cache is left exactly as it
 * was, and the same step with finite data then answers the float64 reference (one key per
 * request: each head's output is its kv head's value row).
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { builtinBackends } from "../../backends/index.ts";
import { checksFiniteOnDevice } from "../../core/data.ts";
import { MANAGER } from "../support/gpu.ts";
import { freshSeed, GPU_TEST, rng } from "./helpers.ts";
import { expectProblem, maxAbsDiff, startServer } from "../server/helpers.ts";

const R = 16, H = 16, HKV = 4, D = 128, BS = 16, NB = R;

/** Step 0 of R requests (one token each, request r in block r), f16-exact random data. */
function step(seed: number): ForwardBody & { query: { data: number[] } } {
  const r = rng(seed);
  const rand = (n: number) => Array.from({ length: n }, () => Math.f16round(r() * 2 - 1));
  return {
    dtype: "float16",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: { dtype: "float16", shape: [R, H, D], data: rand(R * H * D) },
    key: { dtype: "float16", shape: [R, HKV, D], data: rand(R * HKV * D) },
    value: { dtype: "float16", shape: [R, HKV, D], data: rand(R * HKV * D) },
    metadata: {
      query_start_loc: Array.from({ length: R + 1 }, (_, i) => i),
      seq_lens: new Array(R).fill(1),
      block_table: Array.from({ length: R }, (_, i) => [i]),
      slot_mapping: Array.from({ length: R }, (_, i) => i * BS),
    },
  } as ForwardBody & { query: { data: number[] } };
}

Deno.test({
  name: "finite check over HTTP: a NaN in a device-checked decode step is a 422, nothing written",
  ...GPU_TEST,
  fn: async () => {
    const shape = { dtype: "float16" as const, num_tokens: R, num_kv_tokens: R };
    assert.ok(
      checksFiniteOnDevice({ ...shape, layer: { num_heads: H, num_kv_heads: HKV, head_size: D } }),
    );
    const srv = await startServer({
      backends: builtinBackends(),
      device: MANAGER,
      memoryBudgetBytes: 2 ** 28,
    });
    const seed = freshSeed(), r = rng(seed + 1);
    try {
      const c = await srv.client.createCache({
        num_blocks: NB,
        block_size: BS,
        num_kv_heads: HKV,
        head_size: D,
        dtype: "float16",
        kv_cache_dtype: "auto",
      });
      assert.equal(c.storage, "webgpu");
      const before = await srv.client.cacheData(c.id);
      const good = step(seed);
      for (const [name, value] of [["key", NaN], ["value", Infinity], ["query", -Infinity]]) {
        const t = name as "query" | "key" | "value";
        const data = [...(good[t] as { data: number[] }).data];
        const at = Math.floor(r() * data.length);
        data[at] = value as number;
        const bad = { ...good, [t]: { ...good[t], data } } as ForwardBody;
        const e = await expectProblem(
          srv.client.forwardOn(c.id, bad, { binary: true }),
          422,
          "invalid_batch",
          [t, at],
        );
        assert.match(JSON.stringify(e.problem), new RegExp(`element ${at} is ${value} in float16`));
        const now = await srv.client.cacheData(c.id);
        assert.deepEqual(now.key_cache.data, before.key_cache.data, `${t}: key cache unchanged`);
        assert.deepEqual(now.value_cache.data, before.value_cache.data, `${t}: value cache too`);
      }
      const got = await srv.client.forwardOn(c.id, good, { binary: true });
      assert.match(got.backend, /^WEBGPU_/, "a GPU plan, so the check ran on the device");
      const v = (good.value as { data: number[] }).data, G = H / HKV;
      const want = new Float32Array(R * H * D);
      for (let t = 0; t < R; t++) {
        for (let h = 0; h < H; h++) {
          const from = (t * HKV + Math.floor(h / G)) * D;
          want.set(v.slice(from, from + D), (t * H + h) * D);
        }
      }
      assert.ok(maxAbsDiff(got.output.values, want) <= 1e-2, `seed ${seed}`);
    } finally {
      await srv.close();
    }
  },
});
