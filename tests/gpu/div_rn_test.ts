/**
 * The cache write's quotient x / scale (gpu/cache_write.ts DIV_RN) against the correctly rounded
 * f32 quotient, Math.fround(x / s), bit for bit: random pairs, and pairs whose quotient sits on or
 * within an ulp or two of an fp8 rounding edge (x = fround(m s) for midpoints m of fp8 e4m3 and
 * e5m2 codes, and its f32 neighbours), where a quotient one ulp off moves the fp8 code, and
 * subnormal operands and quotients (a device may flush them: the H100 made 1.4e-45 / 1.7 zero,
 * and 1 / 1e-39 an infinity), overflow and zeros. The
 * device's own `/` over the same pairs is counted and printed, not asserted: WGSL allows it 2.5
 * ulp, and NVIDIA's was off (bench/NOTES.md v0.19). Core WGSL: runs on every adapter.
 */
import assert from "node:assert/strict";
import { DIV_RN } from "../../gpu/cache_write.ts";
import { freshSeed, NO_GPU, rng } from "./helpers.ts";
import { runWordKernel } from "./word_kernel.ts";

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
const bits = (x: number) => ((f32[0] = x), u32[0]);
const val = (b: number) => ((u32[0] = b), f32[0]);

/** fp8 midpoints between neighbouring codes over [2^-6, 2^8]: 3 (e4m3) or 2 (e5m2) mantissa bits. */
function midpoints(): number[] {
  const out: number[] = [];
  for (const mb of [3, 2]) {
    for (let e = -6; e < 8; e++) {
      for (let m = 0; m < 2 ** mb; m++) out.push(2 ** e * (1 + (m + 0.5) / 2 ** mb));
    }
  }
  return out;
}

/** (x, s) pairs as f32 bits, interleaved. */
function pairs(seed: number): Uint32Array {
  const r = rng(seed), out: number[] = [];
  const scale = () => Math.fround(Math.round((0.25 + r() * 1.75) * 100) / 100);
  for (const m of midpoints()) {
    const s = scale(), x = bits(Math.fround(m * s));
    for (const d of [-2, -1, 0, 1, 2]) out.push(x + d, bits(s), (x + d) | 0x80000000, bits(s));
  }
  while (out.length < 2 * 16384) {
    out.push(bits(Math.fround((r() * 2 - 1) * 2 ** (r() * 40 - 20))), bits(scale()));
  }
  out.push(0, bits(1.3), 0x80000000, bits(0.7), 0x7f800000, bits(1.3), 0x7fc00000, bits(1.3));
  out.push(bits(3e38), bits(0.25), 1, bits(1.7), bits(2 ** -126), bits(1.3));
  // Subnormal scales (validation takes any finite scale above 0) and quotients.
  for (const sc of [1e-39, 2 ** -140, 2 ** -149, 3e-45]) {
    for (const x of [1, 0.5, 2 ** -126, 1e-40, 1e-44, 3e38, 0]) out.push(bits(x), bits(sc));
  }
  for (const x of [2 ** -126, 2 ** -127, 3 * 2 ** -149, 2 ** -149, 1e-40]) {
    for (const sc of [1.3, 1.7, 2, 3, 0.75, 1e3, 2 ** 24]) out.push(bits(x), bits(sc));
  }
  for (let i = 0; i < 512; i++) {
    const x = Math.fround((r() * 2 - 1) * 2 ** (r() * 60 - 150));
    out.push(bits(x), bits(Math.fround(2 ** (r() * 40 - 10))));
  }
  return new Uint32Array(out);
}

/** `expr` (of x and s) over the pairs on the device, as f32 bits. */
function onDevice(words: Uint32Array, expr: string, tag: string): Promise<Uint32Array> {
  const body = [
    "  let x = bitcast<f32>(src[2u * i]);",
    "  let s = bitcast<f32>(src[2u * i + 1u]);",
    `  dst[i] = bitcast<u32>(${expr});`,
  ].join("\n");
  return runWordKernel(`div_rn[${tag}]`, DIV_RN, body, words, words.length / 2);
}

Deno.test("div_rn: x / s correctly rounded to f32, bit for bit (the device's `/` counted)", {
  ignore: NO_GPU,
}, async () => {
  const seed = freshSeed(), words = pairs(seed), n = words.length / 2;
  const want = Uint32Array.from({ length: n }, (_, i) => {
    const q = Math.fround(val(words[2 * i]) / val(words[2 * i + 1]));
    return Number.isNaN(q) ? 0x7fc00000 : bits(q);
  });
  const plain = await onDevice(words, "x / s", "plain");
  const off = want.filter((w, i) => w !== plain[i] && !(w === 0x7fc00000 && isNaNBits(plain[i])));
  console.log(`  the device's x / s: ${off.length} of ${n} quotients not correctly rounded`);
  const got = await onDevice(words, "div_rn(x, s)", "rn");
  for (let i = 0; i < n; i++) {
    const ok = got[i] === want[i] || (want[i] === 0x7fc00000 && isNaNBits(got[i]));
    const hex = (b: number) => `0x${b.toString(16)}`;
    assert.ok(
      ok,
      `${val(words[2 * i])} / ${val(words[2 * i + 1])}: got ${hex(got[i])} (${val(got[i])}), ` +
        `want ${hex(want[i])} (${val(want[i])}) (seed ${seed})`,
    );
  }
});

function isNaNBits(b: number): boolean {
  return (b & 0x7fffffff) > 0x7f800000;
}
