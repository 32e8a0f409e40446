/**
 * The split-KV decode kernel's word decoders (gpu/decode_codegen.ts DECODERS over
 * wgsl/decode_words.wgsl) against core/dtype decode: every fp8 byte (both formats, NaN codes
 * included), f16 and bf16 special and random patterns, f32 words; each decoded value times the
 * dtype's DECODE_SCALE must be the reference value exactly; the fp8 pair decoders (tuning
 * `fp8_pairs`) too, once put back in element order, and the e4m3 decoders for caches with no NaN
 * byte (NAN_FREE_DECODERS) over every code but the two NaN ones. Core WGSL: runs on GL too.
 */
import assert from "node:assert/strict";
import { bytesPerElement, decode } from "../../core/dtype.ts";
import type { StorageDType } from "../../core/types.ts";
import { BatchBuffers } from "../../gpu/batch_buffers.ts";
import {
  DECODE_SCALE,
  DECODERS,
  NAN_FREE_DECODERS,
  PAIR_DECODERS,
} from "../../gpu/decode_codegen.ts";
import { getComputePipeline } from "../../gpu/pipelines.ts";
import { elementsPerWord, loadWgsl } from "../../gpu/wgsl.ts";
import { freshSeed, gpu, NO_GPU, rng } from "./helpers.ts";

const DTYPES: StorageDType[] = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"];

/** 1024 bytes: every fp8 code 4 times, or random 16/32-bit patterns with special values. */
function patterns(d: StorageDType, seed: number): Uint8Array {
  const r = rng(seed);
  const b = new Uint8Array(1024);
  for (let i = 0; i < b.length; i++) b[i] = bytesPerElement(d) === 1 ? i & 255 : (r() * 256) | 0;
  if (bytesPerElement(d) === 2) {
    const h = new Uint16Array(b.buffer);
    [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0x3c00, 0x007f, 0x0080, 0x7f7f]
      .forEach((v, i) => (h[i] = v));
    // Keep the values finite: non-finite cache values are never read.
    for (let i = 0; i < h.length; i++) {
      if (d === "float16" && (h[i] & 0x7c00) === 0x7c00) h[i] &= 0xbfff;
      if (d === "bfloat16" && (h[i] & 0x7f80) === 0x7f80) h[i] &= 0xbfff;
    }
  }
  if (d === "float32") {
    const f = new Float32Array(b.buffer);
    for (let i = 0; i < f.length; i++) if (!Number.isFinite(f[i])) f[i] = i;
  }
  return b;
}

/** The decoders under test: each dtype's, and the fp8 pair decoders put back in order. */
const CASES: [string, StorageDType, string[]][] = [
  ["fp8_e4m3 NaN-free", "fp8_e4m3", NAN_FREE_DECODERS.words],
  ["fp8_e4m3 NaN-free pairs", "fp8_e4m3", NAN_FREE_DECODERS.pairs.map((x) => `(${x}).xzyw`)],
  ...DTYPES.map((d): [string, StorageDType, string[]] => [d, d, DECODERS[d]]),
  ...(Object.entries(PAIR_DECODERS) as [StorageDType, string[]][]).map((
    [d, dec],
  ): [string, StorageDType, string[]] => [`${d} pairs`, d, dec.map((x) => `(${x}).xzyw`)]),
];

for (const [name, d, decoders] of CASES) {
  Deno.test(`decode words: ${name} decoders times DECODE_SCALE are exact`, {
    ignore: NO_GPU,
  }, async () => {
    const ctx = gpu();
    const seed = freshSeed();
    const bytes = patterns(d, seed);
    // A NaN-free decoder's cache has no NaN byte: those codes become the largest finite ones.
    if (name.includes("NaN-free")) {
      bytes.forEach((b, i) => (bytes[i] = (b & 0x7f) === 0x7f ? b - 1 : b));
    }
    const quads = bytes.byteLength / 16, epw = elementsPerWord(d);
    const code = `${await loadWgsl("decode_words.wgsl")}
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(16) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= ${quads}u) { return; }
  let w = src[g.x];
${
      decoders.map((x, e) => `  dst[g.x * ${epw}u + ${e}u] = ${x} * ${DECODE_SCALE[d]}.0;`).join(
        "\n",
      )
    }
}`;
    const p = await getComputePipeline(ctx, `test.decode_words[${name}]`, code);
    const bb = new BatchBuffers(ctx, "t");
    const out = bb.poisoned(quads * 4 * epw);
    const enc = ctx.device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(p);
    pass.setBindGroup(
      0,
      ctx.device.createBindGroup({
        layout: p.getBindGroupLayout(0),
        entries: [
          { binding: 0, resource: { buffer: bb.storage(bytes) } },
          { binding: 1, resource: { buffer: out } },
        ],
      }),
    );
    pass.dispatchWorkgroups(Math.ceil(quads / 16));
    pass.end();
    const read = bb.readback(enc, [{ buffer: out, floats: quads * 4 * epw }]);
    ctx.device.queue.submit([enc.finish()]);
    const [got] = await read();
    bb.destroy();
    const want = decode(d, bytes);
    for (let i = 0; i < want.length; i++) {
      const ok = Object.is(got[i], want[i]) || (Number.isNaN(got[i]) && Number.isNaN(want[i])) ||
        (got[i] === 0 && want[i] === 0);
      assert.ok(ok, `${d} element ${i}: got ${got[i]}, want ${want[i]} (seed ${seed})`);
    }
  });
}
