/**
 * fp8 e4m3 caches known to hold no NaN byte (gpu/kv_cache.ts `fp8_nan_free`) decode without the
 * NaN fix-up (tuning `fp8_nan_free`, NAN_FREE_DECODERS): which caches are known so (created
 * empty; imported bytes checked, any alignment), that such a cache's calls run the fast kernel
 * and match CPU_REFERENCE on fresh hostile batches (window, sinks, ALiBi, soft cap, LSE, HND and
 * NHD, split rows, through WEBGPU_DECODE and WEBGPU_FLASH's decode rows), and that a cache with
 * NaN bytes, or the knob off, keeps the exact decoder.
 */
import assert from "node:assert/strict";
import { DEFAULT_DECODE_TUNING, makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import type { AttentionBackend, KvCacheSpec } from "../../core/types.ts";
import { GpuKvCache, hasE4m3Nan } from "../../gpu/kv_cache.ts";
import type { BatchSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { BF16_NHD_SPEC, FP8_HND_SPEC } from "../support/decode_knob_specs.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

Deno.test("hasE4m3Nan: a NaN byte anywhere, at any alignment, and nothing else", () => {
  const clean = new Uint8Array(64).map((_, i) => (i * 37) & 0xff).map((b) =>
    (b & 0x7f) === 0x7f ? b - 1 : b
  );
  for (let off = 0; off < 4; off++) {
    for (let len = 0; len <= 13; len++) {
      const view = clean.subarray(off, off + len);
      assert.equal(hasE4m3Nan(view), false, `clean ${off}+${len}`);
      for (let at = 0; at < len; at++) {
        for (const nan of [0x7f, 0xff]) {
          const b = clean.slice();
          b[off + at] = nan;
          assert.equal(hasE4m3Nan(b.subarray(off, off + len)), true, `${nan} at ${off}+${at}`);
        }
      }
    }
  }
  // 0x7e / 0xfe (448, the largest finite) and 0x80 (-0) are not NaN.
  assert.equal(hasE4m3Nan(new Uint8Array([0x7e, 0xfe, 0x80, 0x00, 0x78])), false);
});

const SPEC: KvCacheSpec = {
  num_blocks: 4,
  block_size: 16,
  num_kv_heads: 2,
  head_size: 64,
  dtype: "float16",
  kv_cache_dtype: "fp8_e4m3",
  layout: "NHD",
};

Deno.test("fp8_nan_free: created empty, or imported bytes without a NaN byte", {
  ignore: NO_GPU,
}, async () => {
  const half = 4 * 16 * 2 * 64;
  const made = await GpuKvCache.create(GPU!, SPEC);
  const clean = await GpuKvCache.fromBytes(GPU!, SPEC, new Uint8Array(half), new Uint8Array(half));
  const dirty = new Uint8Array(half);
  dirty[half - 1] = 0xff;
  const withNan = await GpuKvCache.fromBytes(GPU!, SPEC, new Uint8Array(half), dirty);
  const f16 = await GpuKvCache.create(GPU!, { ...SPEC, kv_cache_dtype: "auto" });
  try {
    assert.equal(made.fp8_nan_free, true);
    assert.equal(clean.fp8_nan_free, true);
    assert.equal(withNan.fp8_nan_free, false);
    assert.equal(f16.fp8_nan_free, false, "only e4m3 caches");
  } finally {
    for (const c of [made, clean, withNan, f16]) c.destroy();
  }
});

const FAST = /decode_split\([^)]*nan_free=true/;
const EXACT = /decode_split\([^)]*nan_free=false/;
const SPLIT = { target_workgroups: 4096, wave_workgroups: 528, min_split_keys: 16 };
const decodeOf = (t = {}) =>
  makeWebGpuDecode({ ...DEFAULT_DECODE_TUNING, ...SPLIT, ...t }) as AttentionBackend;

const SPECS: [string, BatchSpec][] = [
  ["f16, fp8_e4m3 HND, window, sinks, ALiBi, soft cap, LSE", FP8_HND_SPEC],
  ["bf16, fp8_e4m3 NHD, GQA 8, head 64, sinks, soft cap, LSE, 3-token rows", {
    ...BF16_NHD_SPEC,
    kv_cache_dtype: "fp8_e4m3",
    k_scale: 0.25,
    v_scale: 3,
  }],
];

for (const [name, spec] of SPECS) {
  Deno.test(`fp8 NaN-free decode: ${name}`, { ignore: NO_GPU }, async () => {
    const clean = { ...spec, finite_fill: true };
    await checkBackend(decodeOf(), GPU!, clean, { kernels: FAST, minItems: 4 });
    await checkBackend(WEBGPU_FLASH as AttentionBackend, GPU!, clean, { kernels: FAST });
    // NaN bytes in the slots nothing reads: the exact decoder.
    await checkBackend(decodeOf(), GPU!, spec, { kernels: EXACT, minItems: 4 });
    // The knob off: the exact decoder on a clean cache too.
    await checkBackend(decodeOf({ fp8_nan_free: false }), GPU!, clean, { kernels: EXACT });
  });
}
