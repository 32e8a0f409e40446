/**
 * Keys the split-KV kernel loads but a row may not see get probability 0, and 0 x Inf is NaN: a
 * non-finite value there must not reach the row. Two ways one gets there, each against
 * CPU_REFERENCE (NaN and infinities where float64 has them, within tolerance elsewhere; output and
 * LSE):
 * - a later token of the same prefill chunk, whose value overflows to Inf in an f16 cache (f32
 *   data of 1e5: finite input, refused by nothing), read by the earlier tokens of its workgroup
 *   under `wg_tokens` (the tokens walk their joint key range);
 * - a context slot before a row's window start but inside its first step of U keys (slices start
 *   at a multiple of U), holding NaN (imported bytes), on one token a workgroup too.
 * Both answered NaN where float64 is finite before the values of invisible keys were masked
 * (gpu/decode_codegen.ts: a step the row does not see whole zeroes those keys' values); and a
 * row that does see the Inf answered NaN instead of Inf (its last, partial step repeats its last
 * key with p = 0). WEBGPU_FLASH's portable tiles failed both the same way until v0.23 (a tile's
 * P V multiplied the whole staged V tile by each row's p).
 * @module
 */
import { makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import { makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { type BatchSpec, generateBatch, type GeneratedBatch } from "../support/batches.ts";
import { ONE_SLICE_TUNING } from "../support/decode_knob_specs.ts";
import {
  backendRunner,
  checkNonFinite,
  OVERFLOW_SPEC,
  plantCacheNaN,
  WINDOWED_SPEC,
} from "../support/nonfinite.ts";
import { freshSeed, NO_GPU } from "../gpu/helpers.ts";

const BASE = ONE_SLICE_TUNING;

/** Runs `g` through `b` and CPU_REFERENCE (output and LSE); the reference's non-finite outputs. */
const check = async (b: AttentionBackend, g: GeneratedBatch, label: string) =>
  (await checkNonFinite(g, backendRunner(b, g.spec), label)).odd;

const BACKENDS: [string, AttentionBackend][] = [
  ["WEBGPU_DECODE, one token a workgroup", makeWebGpuDecode(BASE) as AttentionBackend],
  [
    "WEBGPU_DECODE, 4 tokens a workgroup",
    makeWebGpuDecode({ ...BASE, wg_tokens: 4 }) as AttentionBackend,
  ],
  [
    // The split-KV kernels with 4 tokens a workgroup where the tensor cores are not (the bf16 and
    // window cases reach the tensor-core kernel on Dawn with subgroup matrices).
    "WEBGPU_FLASH, prefill rows",
    makeWebGpuFlash({ tile: null, decode: BASE }) as AttentionBackend,
  ],
  [
    // The portable tiles (wgsl/flash_attention.wgsl, ATTN_PREFILL_SPLIT=0): P V over a staged V
    // tile, masked where a tile is not seen whole by every row (gpu/flash_codegen.ts).
    "WEBGPU_FLASH, portable tiles",
    makeWebGpuFlash({
      tile: null,
      decode: BASE,
      mma: false,
      prefill_split: false,
    }) as AttentionBackend,
  ],
];
// On Dawn with subgroup matrices the bf16 and window cases of WEBGPU_FLASH reach the tensor-core
// kernel, which failed them until v0.23 (flash_mma_masked_values_test.ts has its own cases).

for (const [name, b] of BACKENDS) {
  for (const which of ["value", "key"] as const) {
    Deno.test(`masked keys: a later token's ${which} overflowing to Inf: ${name}`, {
      ignore: NO_GPU,
    }, async () => {
      const g = generateBatch(OVERFLOW_SPEC, freshSeed());
      // Token 5 of request 0 (kv head 1, element 7): Inf once written to the f16 cache; tokens
      // 0-4 cannot see it, 5-11 can.
      const t = g.batch[which] as unknown as Float32Array;
      t[5 * 2 * 64 + 64 + 7] = 1e5;
      const odd = await check(b, g, name);
      if (odd === 0) throw new Error("the planted value reached no row: the case tests nothing");
    });
  }
}

Deno.test("masked keys: a later token's bf16 value over f16's range: WEBGPU_FLASH", {
  ignore: NO_GPU,
}, async () => {
  const spec: BatchSpec = { ...OVERFLOW_SPEC, dtype: "bfloat16" };
  const g = generateBatch(spec, freshSeed());
  // 99840, a bf16 value (1e5 rounded): Inf once written to the f16 cache.
  const t = g.batch.value as unknown as Float32Array;
  t[5 * 2 * 64 + 64 + 7] = 99840;
  const odd = await check(BACKENDS[2][1], g, "WEBGPU_FLASH bf16");
  if (odd === 0) throw new Error("the planted value reached no row: the case tests nothing");
});

for (const [name, b] of BACKENDS) {
  Deno.test(`masked keys: NaN in a context slot before the window: ${name}`, {
    ignore: NO_GPU,
  }, async () => {
    const g = generateBatch(WINDOWED_SPEC, freshSeed());
    // Request 0's context position 9 (queries at 10-13 see 8-10 .. 11-13; a step of 4 keys from
    // 8), request 1's position 17 (its query at 22 sees 20-22, first step from 20: not loaded;
    // position 18's step would be): NaN in K and V, kv head 0, element 3.
    plantCacheNaN(g, 0, 9);
    plantCacheNaN(g, 1, 21 - 4);
    await check(b, g, name);
  });
}
