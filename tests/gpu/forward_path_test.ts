/**
 * The GPU forward path's plumbing: pooled buffers are reused with no leak and no cross-talk
 * (concurrent calls on different caches give the bytes sequential ones give), a batch over a
 * storage-binding limit is refused with 422 `binding_limit_exceeded` naming the tensor and the
 * limit (it used to answer 200 with zeros), and a WebGPU validation error inside a launch fails
 * the call with 500 `gpu_validation_error` instead of returning data the GPU never computed.
 */
import assert from "node:assert/strict";
import { makeWebGpuFlash, WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { ServiceError } from "../../core/errors.ts";
import type { AttentionBackend, GpuContext } from "../../core/types.ts";
import { poolOf } from "../../gpu/buffer_pool.ts";
import { FILL } from "../../gpu/fill.ts";
import { getKernel, packUniforms } from "../../gpu/kernel.ts";
import { launch } from "../../gpu/launch.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { freshSeed, GPU, GPU_TEST } from "./helpers.ts";

const opts = GPU_TEST;
const spec = smallSpec;

async function runOnce(b: AttentionBackend, gpu: GpuContext, s: BatchSpec, seed: number) {
  const g = generateBatch(s, seed);
  const cache = await GpuKvCache.fromBytes(gpu, g.cache_spec!, g.key_cache, g.value_cache);
  try {
    const batch = validHostBatch(g.batch, cache);
    const plan = await b.plan(batch, { gpu });
    try {
      const r = await b.run(plan, batch, { gpu });
      return { out: r.output.bytes, lse: r.lse!, after: await cache.read() };
    } finally {
      b.disposePlan?.(plan);
    }
  } finally {
    cache.destroy();
  }
}

Deno.test("pool: steady-state calls create no buffers and leave none in use", opts, async () => {
  const b = WEBGPU_FLASH as AttentionBackend, gpu = GPU!, pool = poolOf(gpu);
  const seed = freshSeed();
  await runOnce(b, gpu, spec(), seed);
  const warm = pool.stats();
  for (let i = 0; i < 4; i++) await runOnce(b, gpu, spec(), seed);
  const after = pool.stats();
  assert.equal(after.in_use, 0, "every pooled buffer was released");
  assert.equal(after.created, warm.created, "no new buffer after the first call");
  assert.ok(after.reused > warm.reused);
});

Deno.test("pool: concurrent calls on different caches equal sequential ones", opts, async () => {
  const b = WEBGPU_FLASH as AttentionBackend, gpu = GPU!;
  const cases = [spec(), spec({ dtype: "float32", sinks: true }), spec({ head_size: 128 })];
  const seeds = cases.map(() => freshSeed());
  const seq = [];
  for (const [i, s] of cases.entries()) seq.push(await runOnce(b, gpu, s, seeds[i]));
  const con = await Promise.all(cases.map((s, i) => runOnce(b, gpu, s, seeds[i])));
  for (let i = 0; i < cases.length; i++) {
    assert.deepEqual(con[i].out, seq[i].out, `output of call ${i} (seed ${seeds[i]})`);
    assert.deepEqual(con[i].lse, seq[i].lse, `lse of call ${i}`);
    assert.deepEqual(con[i].after, seq[i].after, `cache of call ${i}`);
  }
});

Deno.test("limits: a query over one storage binding is 422, just under runs", opts, async () => {
  // Prefill rows on the tiles in both runs: with split-KV prefill the unlimited run would take
  // another path (per-token partials do not fit the limited binding) and differ in the last bits.
  const b = makeWebGpuFlash({
    tile: null,
    decode: { ...DEFAULT_DECODE_TUNING },
    prefill_split: false,
  }) as AttentionBackend;
  const s = spec({ dtype: "float32", head_size: 64, num_heads: 64, num_kv_heads: 1 });
  const g = generateBatch(s, freshSeed());
  const qBytes = g.batch.query.length * 4;
  const limited = (bytes: number): GpuContext => ({
    ...GPU!,
    limits: { ...GPU!.limits, maxStorageBufferBindingSize: bytes },
  });
  // At the limit: runs and matches an unlimited run.
  const ok = await runOnce(b, limited(qBytes), s, g.seed);
  const free = await runOnce(b, GPU!, s, g.seed);
  assert.deepEqual(ok.out, free.out);
  // One word over: refused before anything runs, naming the tensor and the limit.
  const gpu = limited(qBytes - 4);
  const cache = await GpuKvCache.fromBytes(gpu, g.cache_spec!, g.key_cache, g.value_cache);
  try {
    await assert.rejects(
      async () => await b.plan(validHostBatch(g.batch, cache), { gpu }),
      (e) => {
        assert.ok(e instanceof ServiceError && e.status === 422, String(e));
        assert.equal(e.code, "binding_limit_exceeded");
        assert.match(e.message, /maxStorageBufferBindingSize/);
        assert.ok(["query", "output"].includes(String(e.extra?.tensor)), String(e.extra?.tensor));
        return true;
      },
    );
  } finally {
    cache.destroy();
  }
});

Deno.test("launch: a WebGPU validation error is a 500, never data", opts, async () => {
  const gpu = GPU!;
  const kernel = await getKernel(gpu, FILL, { wg: 64 });
  const dev = gpu.device;
  const params = dev.createBuffer({
    size: 16,
    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
  });
  dev.queue.writeBuffer(params, 0, packUniforms(FILL, { n_words: 4, pattern: 7, nwg_x: 1 }));
  // A uniform buffer bound where a storage buffer is declared: invalid bind group.
  const out = dev.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM });
  await assert.rejects(
    () =>
      launch(gpu, {
        label: "bad",
        uploads: [],
        calls: [{ name: "fill", kernel, bind: { P: params, dst: out }, grid: [1, 1] }],
        reads: [],
      }),
    (e) => e instanceof ServiceError && e.status === 500 && e.code === "gpu_validation_error",
  );
  params.destroy();
  out.destroy();
});
