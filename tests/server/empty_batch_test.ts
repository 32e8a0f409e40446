/**
 * An empty batch (`query_start_loc: [0]`, no request, no token) fits every rule of the contract's
 * metadata, so it is a 200 with a `[0, num_heads, head_size]` output (and a `[num_heads, 0]` LSE)
 * on every backend and both transports, writing nothing; it was a 422 ("num_reqs + 1 >= 2").
 * `query_start_loc: []` stays a 422, and so does an empty batch that carries tokens.
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { builtinBackends } from "../../backends/index.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { NO_GPU } from "../gpu/helpers.ts";
import { newManager } from "../support/gpu.ts";
import { cacheSnapshot, expectProblem, rand, startServer, type TestServer } from "./helpers.ts";

const H = 4, HKV = 2, D = 64;
const SPEC = {
  num_blocks: 4,
  block_size: 16,
  num_kv_heads: HKV,
  head_size: D,
  dtype: "float16" as const,
};

function emptyBody(backend: string): ForwardBody {
  const t = (h: number) => ({ dtype: "float16" as const, shape: [0, h, D], data: [] });
  return {
    dtype: "float16",
    backend,
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: t(H),
    key: t(HKV),
    value: t(HKV),
    metadata: { query_start_loc: [0], seq_lens: [], block_table: [], slot_mapping: [] },
    return_lse: true,
  };
}

async function checkEmpty(srv: TestServer, backends: string[]): Promise<void> {
  for (const backend of backends) {
    const id = `c-${backend.toLowerCase()}`;
    await srv.client.putCache(id, backend === "auto" ? SPEC : { ...SPEC, backend });
    // Some K/V in the cache first, so "writes nothing" is a real check.
    await srv.client.forwardOn(id, {
      ...emptyBody(backend),
      query: { dtype: "float16", shape: [2, H, D], data: rand(2 * H * D) },
      key: { dtype: "float16", shape: [2, HKV, D], data: rand(2 * HKV * D) },
      value: { dtype: "float16", shape: [2, HKV, D], data: rand(2 * HKV * D) },
      metadata: {
        query_start_loc: [0, 2],
        seq_lens: [2],
        block_table: [[1]],
        slot_mapping: [16, 17],
      },
    });
    const before = await cacheSnapshot(srv, id);
    for (const binary of [false, true]) {
      const ans = await srv.client.forwardOn(id, emptyBody(backend), { binary });
      if (backend !== "auto") assert.equal(ans.backend, backend);
      assert.deepEqual(ans.output.shape, [0, H, D], `${backend} binary ${binary}`);
      assert.equal(ans.output.values.length, 0);
      assert.deepEqual(ans.lse!.shape, [H, 0]);
    }
    assert.equal(await cacheSnapshot(srv, id), before, `${backend}: the empty batch wrote nothing`);
  }
}

Deno.test("empty batch: 200 with an empty output on CPU_REFERENCE, both transports", async () => {
  const srv = await startServer();
  try {
    await checkEmpty(srv, ["CPU_REFERENCE"]);
    await srv.client.putCache("x", { ...SPEC, backend: "CPU_REFERENCE" });
    const bad = emptyBody("auto");
    await expectProblem(
      srv.client.forwardOn("x", { ...bad, metadata: { ...bad.metadata, query_start_loc: [] } }),
      422,
      "invalid_batch",
      ["metadata", "query_start_loc"],
    );
    await expectProblem(
      srv.client.forwardOn("x", {
        ...bad,
        query: { dtype: "float16", shape: [1, H, D], data: rand(H * D) },
        key: { dtype: "float16", shape: [1, HKV, D], data: rand(HKV * D) },
        value: { dtype: "float16", shape: [1, HKV, D], data: rand(HKV * D) },
        metadata: { ...bad.metadata, slot_mapping: [3] },
      }),
      422,
      "invalid_batch",
      ["metadata", "query_start_loc", 0],
    );
  } finally {
    await srv.close();
  }
});

Deno.test("empty batch: 200 on the GPU backends", { ignore: NO_GPU }, async () => {
  const device = newManager();
  await device.acquire();
  const srv = await startServer({ backends: builtinBackends() as AttentionBackend[], device });
  try {
    await checkEmpty(srv, ["WEBGPU_FLASH", "WEBGPU_DECODE", "auto"]);
  } finally {
    await srv.close();
    device.close();
  }
});
