/**
 * The output rounding of the tensor-core kernel's epilogue (gpu/flash_mma_staging.ts roundCode):
 * `round_pair(a, b)` on the device against core/dtype's nearest-even f16 rounding, bit for bit,
 * for the integer path (`exact`, the default) and for `pack` (shape field `opack`:
 * pack2x16float inside f16's finite range). Values: exact f16 values, every kind of tie between
 * neighbours and the f32 values beside them, f16's subnormal range, the edge of its range
 * (65504 .. 65520 and past it), infinities, NaNs, zeros, f32 subnormals and random values over
 * 2^-30 .. 2^17. Core WGSL: runs on every adapter (the CI's lavapipe and llvmpipe included), and
 * on the GPU machine it checks that the card's conversion rounds as `opack` assumes.
 */
import assert from "node:assert/strict";
import { f32ToF16Bits } from "../../core/dtype.ts";
import { roundCode } from "../../gpu/flash_mma_staging.ts";
import { freshSeed, NO_GPU, rng } from "./helpers.ts";
import { runWordKernel } from "./word_kernel.ts";

/** f32 values as bits: the cases above, in pairs (an even count). */
function inputs(seed: number): Uint32Array {
  const f = new Float32Array(1), u = new Uint32Array(f.buffer);
  const bits = (x: number) => ((f[0] = x), u[0]);
  const out: number[] = [];
  const h = new Float16Array(1), hu = new Uint16Array(h.buffer);
  const half = (b: number) => ((hu[0] = b), h[0]);
  // f16 values, their midpoints to the next value (ties: even and odd neighbours) and the f32
  // values one ulp either side of each midpoint, over every f16 exponent, both signs.
  for (let e = 0; e < 31; e++) {
    for (const m of [0, 1, 2, 3, 0x155, 0x2aa, 0x3fe, 0x3ff]) {
      const lo = half((e << 10) | m), hi = half(((e << 10) | m) + 1);
      const mid = bits((lo + hi) / 2);
      for (const b of [bits(lo), mid - 1, mid, mid + 1]) out.push(b, b | 0x80000000);
    }
  }
  for (const x of [65503, 65504, 65505, 65519.99, 65520, 65521, 1e5, 3e38, 2 ** -24, 2 ** -25]) {
    out.push(bits(x), bits(-x));
  }
  out.push(0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x00000000, 0x80000000);
  out.push(0x00000001, 0x807fffff, 0x00400000); // f32 subnormals
  const r = rng(seed);
  while (out.length < 4096) {
    const x = (r() + 0.5) * 2 ** Math.floor(r() * 47 - 30);
    out.push(bits(r() < 0.5 ? -x : x));
  }
  if (out.length % 2) out.push(0);
  return new Uint32Array(out);
}

/** round_pair over `words` (pairs) on the device, in `mode`: one u32 a pair. */
async function roundOnDevice(words: Uint32Array, mode: "exact" | "pack"): Promise<Uint32Array> {
  const body = "  dst[i] = round_pair(bitcast<f32>(src[2u * i]), bitcast<f32>(src[2u * i + 1u]));";
  return runWordKernel(
    `round_pair[${mode}]`,
    await roundCode("float16", mode),
    body,
    words,
    words.length / 2,
  );
}

/** The f16 bits core/dtype.ts gives f32 bits `b`; f32 subnormals may be flushed: also ±0. */
function wanted(b: number): number[] {
  const f = new Float32Array(new Uint32Array([b]).buffer)[0];
  const sub = (b & 0x7f800000) === 0 && (b & 0x7fffff) !== 0;
  return sub ? [f32ToF16Bits(f), 0, 0x8000] : [f32ToF16Bits(f)];
}

for (const mode of ["exact", "pack"] as const) {
  Deno.test(`round_pair (${mode}): f16 nearest-even rounding, bit for bit`, {
    ignore: NO_GPU,
  }, async () => {
    const seed = freshSeed();
    const words = inputs(seed);
    const got = await roundOnDevice(words, mode);
    const isNaN16 = (h: number) => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0;
    for (let i = 0; i < words.length; i++) {
      const h = i % 2 ? got[i >> 1] >>> 16 : got[i >> 1] & 0xffff;
      const b = words[i], hex = (x: number) => `0x${x.toString(16)}`;
      const nan = (b & 0x7fffffff) > 0x7f800000;
      const want = nan ? [(b >>> 16) & 0x8000 | 0x7e00] : wanted(b);
      assert.ok(
        want.includes(h) && (!nan || isNaN16(h)),
        `f32 ${hex(b)}: got ${hex(h)}, want ${want.map(hex).join(" or ")} (seed ${seed})`,
      );
    }
  });
}
