/**
 * Large uploads through mapped staging buffers kept between calls (gpu/upload_staging.ts):
 * the bytes land exactly where a `writeBuffer` would put them (at an offset too), calls after
 * the first reuse the staging buffers instead of creating them, concurrent calls each get
 * their own, and a forward over a large batch gives the same output either way.
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { toFloat32 } from "../../core/data.ts";
import type { AttentionBackend, GpuContext } from "../../core/types.ts";
import type { GpuPlan } from "../../gpu/gpu_plan.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { generateBatch, smallSpec } from "../support/batches.ts";
import { assertClose, assertSameBytes } from "../support/compare.ts";
import { poolOf } from "../../gpu/buffer_pool.ts";
import { launch } from "../../gpu/launch.ts";
import {
  forceStagedUploads,
  STAGED_UPLOAD_BYTES,
  stagedUploads,
  stagingOf,
} from "../../gpu/upload_staging.ts";
import { freshSeed, GPU, GPU_TEST, rng } from "./helpers.ts";

const opts = GPU_TEST;

function randomBytes(seed: number, n: number): Uint8Array {
  const r = rng(seed), a = new Uint8Array(n);
  for (let i = 0; i < n; i += 4) a.set([r() * 256, r() * 256, r() * 256, r() * 256], i);
  return a;
}

/** Uploads `data` at `offset` of a pooled buffer and reads the buffer back. */
async function roundTrip(gpu: GpuContext, data: Uint8Array, offset: number): Promise<Uint8Array> {
  const pool = poolOf(gpu);
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
  const buf = pool.acquire(offset + data.byteLength, usage, "staging-test");
  try {
    const r = await launch(gpu, {
      label: "staging-test",
      uploads: [{ buffer: buf, data, offset }],
      calls: [],
      reads: [{ buffer: buf, bytes: data.byteLength, offset }],
    });
    return r.parts[0];
  } finally {
    pool.release(buf);
  }
}

Deno.test("staging: large uploads land exactly, and reuse their buffers", opts, async () => {
  const gpu = GPU!, staging = stagingOf(gpu);
  forceStagedUploads(true);
  try {
    const n = STAGED_UPLOAD_BYTES + 4096;
    const seed = freshSeed();
    const first = randomBytes(seed, n);
    assertSameBytes(await roundTrip(gpu, first, 0), first, `call 0 (seed ${seed})`);
    const s0 = staging.stats();
    for (let i = 1; i <= 3; i++) {
      const data = randomBytes(seed + i, n);
      assertSameBytes(await roundTrip(gpu, data, 256 * i), data, `call ${i} (seed ${seed})`);
    }
    const s1 = staging.stats();
    assert.equal(s1.created, s0.created, "no staging buffer created after the first call");
    assert.ok(s1.reused >= s0.reused + 3);
    // Concurrent calls get a buffer each, and each its own bytes.
    const datas = [1, 2, 3].map((k) => randomBytes(seed * 7 + k, n));
    const outs = await Promise.all(datas.map((d) => roundTrip(gpu, d, 0)));
    outs.forEach((o, k) => assertSameBytes(o, datas[k], `concurrent call ${k} (seed ${seed})`));
    // Below the threshold nothing is staged.
    const before = staging.stats();
    const small = randomBytes(seed, 4096);
    assertSameBytes(await roundTrip(gpu, small, 0), small, "small upload");
    const after = staging.stats();
    assert.equal(after.reused + after.created, before.reused + before.created);
  } finally {
    forceStagedUploads(null);
  }
});

Deno.test("staging: a forward with a staged query answers as with writeBuffer", opts, async () => {
  const gpu = GPU!;
  // 2100 decode requests: a 4.3 MB f16 query (staged), cheap to attend.
  const spec = smallSpec({
    head_size: 128,
    num_heads: 8,
    requests: Array.from({ length: 2100 }, (_, i) => ({ query_len: 1, seq_len: 1 + (i % 5) })),
  });
  const seed = freshSeed();
  const g = generateBatch(spec, seed);
  const ref = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
  const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, ref), { gpu: null });
  const outs: Uint8Array[] = [];
  for (const on of [true, false]) {
    forceStagedUploads(on);
    const cache = await GpuKvCache.fromBytes(gpu, g.cache_spec!, g.key_cache, g.value_cache);
    try {
      const batch = validHostBatch(g.batch, cache);
      assert.ok(batch.query.bytes.byteLength >= STAGED_UPLOAD_BYTES);
      const b = WEBGPU_FLASH as AttentionBackend<GpuPlan>;
      const before = stagingOf(gpu).stats();
      const got = await b.run(await b.plan(batch, { gpu }), batch, { gpu });
      const after = stagingOf(gpu).stats();
      const used = after.created + after.reused - before.created - before.reused;
      assert.equal(used > 0, on, `staging used: ${used}`);
      assertClose(toFloat32(got.output), toFloat32(want.output), {
        atol: 1e-2,
        rtol: 1e-2,
        label: `output, staging ${on} (seed ${seed})`,
      });
      outs.push(got.output.bytes);
    } finally {
      cache.destroy();
      forceStagedUploads(null);
    }
  }
  assertSameBytes(outs[0], outs[1], "staged and written outputs");
});

Deno.test("upload staging: on by default for a hardware adapter off Deno's runtime only", () => {
  forceStagedUploads(null);
  const hw = {
    vendor: "nvidia",
    architecture: "hopper",
    device: "NVIDIA H200",
    description: "NVIDIA: 580.159.04",
  };
  const soft = { ...hw, vendor: "mesa", architecture: "software", device: "llvmpipe" };
  const fake = (device: object, adapter_info: GpuContext["adapter_info"]) =>
    ({ device, adapter_info }) as unknown as GpuContext;
  assert.equal(stagedUploads(fake({}, hw)), true, "a non-Deno device on a hardware adapter");
  assert.equal(stagedUploads(fake({}, soft)), false, "a software adapter");
  const denoDevice = Object.create(GPUDevice.prototype);
  assert.equal(stagedUploads(fake(denoDevice, hw)), false, "Deno's own GPUDevice");
  forceStagedUploads(true);
  assert.equal(stagedUploads(fake(denoDevice, soft)), true, "forced on");
  forceStagedUploads(null);
});
