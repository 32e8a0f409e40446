/**
 * The forward route frees a safetensors body's memory once the call is answered
 * (server/forward_routes.ts releaseBody): the tensors the service saw were views into the body,
 * and after the answer their buffer is detached. A prefill and two decode steps on a held cache,
 * each sent after the one before had its body released, still match float64: what the cache
 * kept of the earlier steps' K/V was copied, not a view into a released body. On WebGPU (skipped
 * without an adapter), a call whose plan comes from the plan cache after the bodies of the calls
 * before were released matches float64 too: the cached plan's tables were copies. A refused
 * call's body is released as well.
 */
import assert from "node:assert/strict";
import type { ForwardInput } from "../../wire/codec.ts";
import { releaseBody } from "../../server/forward_routes.ts";
import { maxAbsDiff, rand, refAttention, serverMode, startServer, to3d } from "./helpers.ts";
import { isPooledBodyBuffer } from "../../server/http1_body_pool.ts";
import { builtinBackends } from "../../backends/index.ts";
import type { AttentionBackend } from "../../core/types.ts";
import type { ForwardBody } from "../../client/client.ts";
import { NO_GPU } from "../gpu/helpers.ts";
import { newManager } from "../support/gpu.ts";
import { F32_CACHE, Seqs } from "./seqs.ts";

/**
 * Released: detached, or, on the service's own HTTP/1.1 server, one of its pooled body buffers
 * (given back for the next call's body: the steps after it then read into the same memory).
 */
const released = (b: ArrayBufferLike) =>
  serverMode.engine === "http1" ? isPooledBodyBuffer(b) : b.byteLength === 0;

Deno.test("forward over HTTP: a safetensors body's memory is released once answered", async () => {
  const srv = await startServer();
  const seen: ForwardInput[] = [];
  const forward = srv.service.forward.bind(srv.service);
  srv.service.forward = (input, opts) => {
    seen.push(input);
    return forward(input, opts);
  };
  try {
    const info = await srv.client.createCache(F32_CACHE);
    const seqs = new Seqs(Math.fround);
    for (const lens of [[3, 2], [1, 1], [1, 1]]) {
      const { body, refOut } = seqs.step(lens, "float32");
      const ans = await srv.client.forward({ ...body, kv_cache: info.id }, { binary: true });
      const err = maxAbsDiff(ans.output.values, refOut);
      assert.ok(err < 2e-5, `${lens}: output max abs err ${err}`);
      const q = seen.at(-1)!.query.array.bytes;
      assert.ok(released(q.buffer), `${lens}: the body's buffer was not released`);
    }
    assert.equal(seen.length, 3);
    // A refused call's body is released too (a 422 from validation: the cache's dtype is f32).
    const { body } = seqs.step([1, 1], "float32");
    const refused = srv.client.forward({ ...body, dtype: "float16", kv_cache: info.id }, {
      binary: true,
    });
    await assert.rejects(refused, /422/);
    assert.equal(seen.length, 4);
    assert.ok(released(seen[3].query.array.bytes.buffer), "the refused body was released");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("releaseBody: detaches once, leaves a detached or empty buffer alone", () => {
  const bytes = new Uint8Array(64).fill(7);
  const view = bytes.subarray(8, 16);
  releaseBody(bytes);
  assert.equal(bytes.buffer.byteLength, 0);
  assert.equal(view.byteLength, 0);
  releaseBody(bytes); // already detached: no throw
  releaseBody(new Uint8Array(0));
  const moved = new Uint8Array(16);
  structuredClone(moved.buffer, { transfer: [moved.buffer] });
  releaseBody(moved);
});

Deno.test({
  name: "forward over HTTP (WebGPU): calls that reuse a plan after the bodies before were released",
  ignore: NO_GPU,
  sanitizeOps: false,
  sanitizeResources: false,
}, async () => {
  const H = 4, Hkv = 2, D = 64, S = 20;
  const device = newManager();
  await device.acquire();
  const srv = await startServer({ device, backends: builtinBackends() as AttentionBackend[] });
  try {
    const c = await srv.client.createCache({
      num_blocks: 4,
      block_size: 16,
      num_kv_heads: Hkv,
      head_size: D,
      dtype: "float32",
    });
    const k = Array.from({ length: S }, () => rand(Hkv * D));
    const v = Array.from({ length: S }, () => rand(Hkv * D));
    const body = (q: number[], n: number): ForwardBody => ({
      backend: "WEBGPU_FLASH",
      dtype: "float32",
      layer: { num_heads: H, num_kv_heads: Hkv, head_size: D },
      query: { dtype: "float32", shape: [n, H, D], data: q },
      key: { dtype: "float32", shape: [n, Hkv, D], data: k.slice(S - n).flat() },
      value: { dtype: "float32", shape: [n, Hkv, D], data: v.slice(S - n).flat() },
      metadata: {
        query_start_loc: [0, n],
        seq_lens: [S],
        block_table: [[2, 0]],
        // Position p sits in logical block p / 16 of the table [2, 0].
        slot_mapping: Array.from({ length: n }, (_, i) => S - n + i)
          .map((p) => [2, 0][Math.floor(p / 16)] * 16 + (p % 16)),
      },
      kv_cache: c.id,
    });
    // The first call writes all S keys; the next ones rewrite the last key with the same values
    // and the same metadata each time (a plan-cache hit), with a new query.
    const calls: [number[], number][] = [[rand(S * H * D), S], [rand(H * D), 1], [rand(H * D), 1]];
    const hits0 = srv.service.plans.stats().hits;
    for (const [q, n] of calls) {
      const ans = await srv.client.forward(body(q, n), { binary: true });
      assert.equal(ans.backend, "WEBGPU_FLASH");
      const want = refAttention({
        q: to3d(q, n, H, D),
        k: to3d(k.flat(), S, Hkv, D),
        v: to3d(v.flat(), S, Hkv, D),
      });
      const err = maxAbsDiff(ans.output.values, want.out.flat(2));
      assert.ok(err < 1e-4, `n ${n}: output max abs err ${err}`);
    }
    assert.equal(
      srv.service.plans.stats().hits - hits0,
      1,
      "the third call reused the second's plan",
    );
  } finally {
    await srv.close();
    device.close();
  }
});
