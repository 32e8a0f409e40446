import assert from "node:assert/strict";
import { bytesPerElement, decode, encode } from "../../core/dtype.ts";
import type { StorageDType } from "../../core/types.ts";
import { BatchBuffers, UniformBuilder } from "../../gpu/batch_buffers.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { getComputePipeline } from "../../gpu/pipelines.ts";
import {
  decodeHelpers,
  elementsPerWord,
  kvAccessors,
  loadWgsl,
  specialize,
} from "../../gpu/wgsl.ts";
import { freshSeed, gpu, NO_GPU, rng } from "./helpers.ts";

Deno.test("wgsl: specialize substitutes typed literals and names missing values", async () => {
  assert.equal(
    specialize("a {{N}} {{X:f32}} {{Y:i32}} {{B}} {{S}}", { N: 4, X: 2, Y: -1, B: true, S: "f16" }),
    "a 4u 2.0 -1i true f16",
  );
  assert.throws(() => specialize("{{A}} {{B}}", { A: 1 }), /without a value: B/);
  assert.throws(() => specialize("{{A}}", { A: 1.5 }), /not an integer/);
  assert.match(await loadWgsl("cache_write.wgsl"), /reshape_and_cache/);
  assert.ok(!decodeHelpers("float16").includes("enable"));
});

const DTYPES: StorageDType[] = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"];

/** Every byte pattern of interest: all 256 fp8 codes; random plus special 16/32-bit patterns. */
function patterns(d: StorageDType, seed: number): Uint8Array {
  const r = rng(seed);
  const eb = bytesPerElement(d);
  const n = eb === 1 ? 256 : 512;
  const b = new Uint8Array(n * eb);
  for (let i = 0; i < b.length; i++) b[i] = (r() * 256) | 0;
  if (eb === 1) b.forEach((_, i) => (b[i] = i));
  if (eb === 2) {
    const h = new Uint16Array(b.buffer);
    [
      0x0000,
      0x8000,
      0x0001,
      0x8001,
      0x03ff,
      0x0400,
      0x7bff,
      0x7c00,
      0xfc00,
      0x3c00,
      0x007f,
      0x0080,
      0x7f7f,
      0xff7f,
    ]
      .forEach((v, i) => (h[i] = v));
  }
  if (eb === 4) {
    // keep f32 finite (NaN payloads may be canonicalised by the GPU; not a decode concern)
    const f = new Float32Array(b.buffer);
    for (let i = 0; i < f.length; i++) if (!Number.isFinite(f[i])) f[i] = i;
  }
  return b;
}

Deno.test("wgsl: element decoders agree with core/dtype decode for every storage dtype", {
  ignore: NO_GPU,
}, async (t) => {
  const ctx = gpu();
  for (const d of DTYPES) {
    await t.step(d, async () => {
      const seed = freshSeed();
      const bytes = patterns(d, seed);
      const words = bytes.byteLength / 4, epw = elementsPerWord(d);
      const code = `${decodeHelpers(d)}
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= ${words}u) { return; }
  let x = kv_decode(src[g.x]);
  for (var e = 0u; e < KV_EPW; e++) { dst[g.x * KV_EPW + e] = x[e]; }
  if (kv_elem(src[g.x], KV_EPW - 1u) != x[KV_EPW - 1u] && x[KV_EPW - 1u] == x[KV_EPW - 1u]) { dst[g.x * KV_EPW] = 1e30; }
}`;
      const p = await getComputePipeline(ctx, `test.decode[${d}]`, code);
      const bb = new BatchBuffers(ctx, "t");
      const out = bb.poisoned(words * epw);
      const enc = ctx.device.createCommandEncoder();
      const pass = enc.beginComputePass();
      pass.setPipeline(p);
      pass.setBindGroup(
        0,
        ctx.device.createBindGroup({
          layout: p.getBindGroupLayout(0),
          entries: [{ binding: 0, resource: { buffer: bb.storage(bytes) } }, {
            binding: 1,
            resource: { buffer: out },
          }],
        }),
      );
      pass.dispatchWorkgroups(Math.ceil(words / 64));
      pass.end();
      const read = bb.readback(enc, [{ buffer: out, floats: words * epw }]);
      ctx.device.queue.submit([enc.finish()]);
      const [got] = await read();
      bb.destroy();
      const want = decode(d, bytes);
      for (let i = 0; i < want.length; i++) {
        const ok = Object.is(got[i], want[i]) || (Number.isNaN(got[i]) && Number.isNaN(want[i])) ||
          (got[i] === 0 && want[i] === 0 && d === "float16"); // sign of a flushed f16 zero is fine
        assert.ok(ok, `${d} element ${i}: got ${got[i]}, want ${want[i]} (seed ${seed})`);
      }
    });
  }
});

Deno.test("wgsl: chunked accessor reads across chunk buffers (scalar and vec4)", {
  ignore: NO_GPU,
}, async () => {
  const ctx = gpu();
  const spec = {
    num_blocks: 5,
    block_size: 16,
    num_kv_heads: 1,
    head_size: 4,
    dtype: "float32",
    kv_cache_dtype: "auto",
    layout: "NHD",
  } as const;
  const n = 5 * 16 * 4;
  const k = new Float32Array(n).map((_, i) => i), v = new Float32Array(n).map((_, i) => -i);
  const cache = await GpuKvCache.fromBytes(ctx, spec, encode("float32", k), encode("float32", v), {
    maxBlocksPerChunk: 2,
  });
  assert.equal(cache.geometry.nchunk, 3);
  const bw = cache.geometry.block_words;
  for (const vec4 of [false, true]) {
    const code = `${cache.accessorWgsl({ firstBinding: 2, vec4 })}
struct U { n: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<uniform> u: U;
@group(0) @binding(1) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= u.n) { return; }
  let block = g.x / ${bw}u; let w = g.x % ${bw}u;
  ${
      vec4
        ? "let a = load_k4(block, w & ~3u)[w & 3u]; let b = load_v4(block, w & ~3u)[w & 3u];"
        : "let a = load_k(block, w); let b = load_v(block, w);"
    }
  o[g.x] = a; o[u.n + g.x] = b;
}`;
    const p = await getComputePipeline(ctx, `test.accessor:${cache.chunkKey}:v${vec4}`, code);
    const bb = new BatchBuffers(ctx, "t");
    const out = bb.poisoned(2 * n);
    const enc = ctx.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(p);
    pass.setBindGroup(
      0,
      ctx.device.createBindGroup({
        layout: p.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: bb.uniform(new UniformBuilder().u32(n)) } },
          { binding: 1, resource: { buffer: out } },
          ...cache.bindEntries(2),
        ],
      }),
    );
    pass.dispatchWorkgroups(Math.ceil(n / 64));
    pass.end();
    const read = bb.readback(enc, [{ buffer: out, floats: 2 * n }]);
    ctx.device.queue.submit([enc.finish()]);
    const [got] = await read();
    bb.destroy();
    assert.deepEqual([...got.subarray(0, n)], [...k], `K via ${vec4 ? "vec4" : "u32"}`);
    assert.deepEqual([...got.subarray(n)], [...v], `V via ${vec4 ? "vec4" : "u32"}`);
  }
  cache.destroy();
  assert.throws(
    () => kvAccessors({ nchunk: 0, blocksPerChunk: 1, blockWords: 1, firstBinding: 0 }),
    /nchunk/,
  );
});
