import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import { newManager } from "../support/gpu.ts";
import { GpuKvCache, kvChunkGeometry } from "../../gpu/kv_cache.ts";
import { freshSeed, gpu, NO_GPU, rng } from "./helpers.ts";

const spec = (o: Partial<KvCacheSpec> = {}): KvCacheSpec => ({
  num_blocks: 7,
  block_size: 16,
  num_kv_heads: 2,
  head_size: 8,
  dtype: "float16",
  kv_cache_dtype: "auto",
  layout: "NHD",
  ...o,
});

function randomBytes(n: number, seed: number): Uint8Array {
  const r = rng(seed), b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (r() * 256) | 0;
  return b;
}

Deno.test(
  "kv cache: bytes round trip, single and forced multi-chunk",
  { ignore: NO_GPU },
  async (t) => {
    const ctx = gpu();
    for (
      const [name, opts, nchunk] of [["one chunk", {}, 1], ["three chunks", {
        maxBlocksPerChunk: 3,
      }, 3]] as const
    ) {
      await t.step(name, async () => {
        const seed = freshSeed();
        const s = spec({
          layout: nchunk === 1 ? "NHD" : "HND",
          kv_cache_dtype: nchunk === 1 ? "auto" : "fp8_e4m3",
        });
        const g = kvChunkGeometry(ctx, s, opts);
        assert.equal(g.nchunk, nchunk);
        const half = g.bytes / 2;
        assert.equal(half, 7 * 16 * 2 * 8 * (nchunk === 1 ? 2 : 1));
        const k = randomBytes(half, seed), v = randomBytes(half, seed + 1);
        const c = await GpuKvCache.fromBytes(ctx, s, k, v, opts);
        assert.equal(c.storage, "webgpu");
        assert.equal(c.bytes, 2 * half);
        assert.equal(c.keyBuffers.length, nchunk);
        assert.equal(c.bindEntries(4).length, 2 * nchunk);
        const got = await c.read();
        assert.deepEqual(got.key, k, `seed ${seed}`);
        assert.deepEqual(got.value, v, `seed ${seed}`);
        c.destroy();
        c.destroy(); // idempotent
      });
    }
    await t.step("create is zeroed", async () => {
      const c = await GpuKvCache.create(ctx, spec({ num_blocks: 3 }), { maxBlocksPerChunk: 2 });
      const { key, value } = await c.read();
      assert.equal(key.length, 3 * 16 * 2 * 8 * 2);
      assert.ok(key.every((x) => x === 0) && value.every((x) => x === 0));
      c.destroy();
    });
  },
);

Deno.test("kv cache: refusals are 422 with the numbers", { ignore: NO_GPU }, async () => {
  const ctx = gpu();
  const tooBig = () => kvChunkGeometry(ctx, spec({ num_blocks: 100 }), { maxBlocksPerChunk: 1 });
  assert.throws(tooBig, (e: unknown) => {
    assert.ok(e instanceof ServiceError);
    assert.equal(e.status, 422);
    assert.equal(e.code, "kv_cache_too_large");
    assert.match(e.message, /100 blocks needs 51200 B per tensor/);
    return true;
  });
  // Past the binding limit for real: 8 chunks of maxStorageBufferBindingSize each is over.
  const maxB = Math.min(ctx.limits.maxStorageBufferBindingSize, ctx.limits.maxBufferSize);
  const blocks = Math.ceil((9 * maxB) / (16 * 2 * 8 * 2));
  assert.throws(
    () => kvChunkGeometry(ctx, spec({ num_blocks: blocks })),
    /kv_cache_too_large|needs/,
  );
  assert.throws(
    () => kvChunkGeometry(ctx, spec({ block_size: 1, num_kv_heads: 1, head_size: 3 })),
    (e: unknown) =>
      e instanceof ServiceError && e.code === "kv_cache_unaligned" && /6 B/.test(e.message),
  );
  await assert.rejects(
    () => GpuKvCache.fromBytes(ctx, spec(), new Uint8Array(10), new Uint8Array(10)),
    (e: unknown) =>
      e instanceof ServiceError && e.status === 422 && /key_cache has 10 bytes/.test(e.message),
  );
});

Deno.test("kv cache: marks itself lost with its device", { ignore: NO_GPU }, async () => {
  const mgr = newManager();
  const ctx = (await mgr.acquire())!;
  const c = await GpuKvCache.create(ctx, spec());
  assert.equal(c.lost, false);
  ctx.device.destroy();
  await ctx.device.lost;
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(c.lost, true);
  assert.throws(
    () => c.assertUsable(),
    (e: unknown) => e instanceof ServiceError && e.status === 503,
  );
  await assert.rejects(() => c.read(), /lost/);
  c.destroy();
});

Deno.test("kv cache: used after destroy() is a 409 cache_destroyed, as a host cache's", {
  ignore: NO_GPU,
}, async () => {
  const c = await GpuKvCache.create(gpu(), spec());
  c.destroy();
  const destroyed = (e: unknown) =>
    e instanceof ServiceError && e.status === 409 && e.code === "cache_destroyed";
  await assert.rejects(() => c.read(), destroyed);
  assert.throws(() => c.assertUsable(), destroyed);
});

Deno.test("GpuKvCache: a spec outside the schema's lists is refused before any buffer", {
  ignore: NO_GPU,
}, async () => {
  const ctx = gpu();
  const spec = {
    num_blocks: 2,
    block_size: 16,
    num_kv_heads: 1,
    head_size: 32,
    dtype: "float16",
    kv_cache_dtype: "auto",
    layout: "NHD",
  } as const;
  for (const bad of [{ dtype: "float64" }, { kv_cache_dtype: "int4" }, { num_blocks: 0 }]) {
    const s = { ...spec, ...bad } as unknown as KvCacheSpec;
    await assert.rejects(() => GpuKvCache.create(ctx, s), (e: unknown) => {
      assert.ok(e instanceof ServiceError && e.code === "invalid_cache_spec", String(e));
      return true;
    });
    const none = new Uint8Array(0);
    await assert.rejects(() => GpuKvCache.fromBytes(ctx, s, none, none), /must be/);
  }
});
