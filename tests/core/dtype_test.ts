/**
 * core/dtype.ts: float16 / bfloat16 round-to-nearest-even (ties, subnormals, overflow to
 * inf), the fp8 e4m3 / e5m2 decode tables, exact round trips of every finite code, ties to
 * the even code between every pair of neighbours, saturation, and the byte codecs.
 */
import assert from "node:assert/strict";
import {
  bf16BitsToF32,
  bytesPerElement,
  decode,
  encode,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
  f32ToFp8E4m3,
  f32ToFp8E5m2,
  FP8_E4M3_TABLE,
  FP8_E5M2_TABLE,
  resolveStorage,
  roundTo,
} from "../../core/dtype.ts";
import type { StorageDType } from "../../core/types.ts";
import { Rng } from "../support/rng.ts";

const hex = (b: number) => "0x" + b.toString(16);

Deno.test("float16: nearest even, ties, subnormals, overflow", () => {
  // Normal range: 1 has ulp 2^-10; halfway points go to the even mantissa.
  assert.equal(f32ToF16Bits(1), 0x3c00);
  assert.equal(f32ToF16Bits(1 + 2 ** -11), 0x3c00, "tie 1|1+ulp goes to even 1");
  assert.equal(f32ToF16Bits(1 + 3 * 2 ** -11), 0x3c02, "tie odd|even goes up to even");
  assert.equal(f32ToF16Bits(1 + 2 ** -11 + 2 ** -20), 0x3c01, "just above a tie goes up");
  assert.equal(f32ToF16Bits(-(1 + 2 ** -11)), 0xbc00);
  // Subnormals: smallest 2^-24, ties at odd multiples of 2^-25.
  assert.equal(f32ToF16Bits(2 ** -24), 0x0001);
  assert.equal(f32ToF16Bits(2 ** -25), 0x0000, "half the smallest subnormal rounds to +0");
  assert.equal(f32ToF16Bits(3 * 2 ** -25), 0x0002, "tie 1|2 subnormal goes to 2");
  assert.equal(f32ToF16Bits(2 ** -25 + 2 ** -40), 0x0001);
  assert.equal(f16BitsToF32(0x03ff), 1023 * 2 ** -24, "largest subnormal");
  assert.equal(f16BitsToF32(0x0400), 2 ** -14, "smallest normal");
  // Overflow: 65504 is the max; the tie with 65536 rounds to even = inf.
  assert.equal(f32ToF16Bits(65504), 0x7bff);
  assert.equal(f32ToF16Bits(65519), 0x7bff);
  assert.equal(f32ToF16Bits(65520), 0x7c00);
  assert.equal(f32ToF16Bits(1e6), 0x7c00);
  assert.equal(f32ToF16Bits(-1e6), 0xfc00);
  assert.equal(f16BitsToF32(0x7c00), Infinity);
  assert.ok(Number.isNaN(f16BitsToF32(f32ToF16Bits(NaN))));
  assert.ok(Object.is(f16BitsToF32(f32ToF16Bits(-0)), -0));
  assert.equal(roundTo("float16", 1 + 3 * 2 ** -11), 1 + 2 ** -9);
});

Deno.test("bfloat16: nearest even, ties, subnormals, overflow", () => {
  assert.equal(f32ToBf16Bits(1), 0x3f80);
  assert.equal(f32ToBf16Bits(1 + 2 ** -8), 0x3f80, "tie goes to even");
  assert.equal(f32ToBf16Bits(1 + 3 * 2 ** -8), 0x3f82, "tie odd|even goes up");
  assert.equal(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -20), 0x3f81);
  assert.equal(f32ToBf16Bits(-(1 + 3 * 2 ** -8)), 0xbf82);
  // Subnormals share float32's exponent range: smallest bf16 subnormal is 2^-133.
  assert.equal(f32ToBf16Bits(2 ** -133), 0x0001);
  assert.equal(bf16BitsToF32(0x0001), 2 ** -133);
  assert.equal(f32ToBf16Bits(2 ** -134), 0x0000, "tie 0|1 subnormal goes to 0");
  assert.equal(f32ToBf16Bits(3 * 2 ** -134), 0x0002, "tie 1|2 subnormal goes to 2");
  // Overflow: max finite 0x7f7f; float32 max rounds past it to inf.
  assert.equal(bf16BitsToF32(0x7f7f), (2 - 2 ** -7) * 2 ** 127);
  assert.equal(f32ToBf16Bits(3.4028234663852886e38), 0x7f80);
  assert.equal(f32ToBf16Bits(-3.4028234663852886e38), 0xff80);
  assert.equal(f32ToBf16Bits(Infinity), 0x7f80);
  assert.ok(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(NaN))), "NaN stays NaN (not inf)");
  assert.equal(roundTo("bfloat16", 1 + 3 * 2 ** -8), 1 + 2 ** -6);
});

Deno.test("float16 and bfloat16: every finite bit pattern round-trips", () => {
  for (let b = 0; b < 0x10000; b++) {
    const h = f16BitsToF32(b);
    if (Number.isFinite(h)) assert.equal(f32ToF16Bits(h), b, `f16 ${hex(b)}`);
    const g = bf16BitsToF32(b);
    if (Number.isFinite(g)) assert.equal(f32ToBf16Bits(g), b, `bf16 ${hex(b)}`);
  }
});

Deno.test("fp8 decode tables: spot values", () => {
  const e4 = FP8_E4M3_TABLE, e5 = FP8_E5M2_TABLE;
  assert.equal(e4[0x7e], 448);
  assert.equal(e4[0xfe], -448);
  assert.equal(e4[0x01], 2 ** -9);
  assert.equal(e4[0x07], 7 * 2 ** -9);
  assert.equal(e4[0x08], 2 ** -6);
  assert.equal(e4[0x38], 1);
  assert.equal(e4[0x39], 1.125);
  assert.ok(Number.isNaN(e4[0x7f]) && Number.isNaN(e4[0xff]));
  assert.ok(Object.is(e4[0x80], -0));
  assert.equal(e4.filter((x) => !Number.isFinite(x)).length, 2, "e4m3fn: only two NaNs, no inf");
  assert.equal(e5[0x7b], 57344);
  assert.equal(e5[0x7c], Infinity);
  assert.equal(e5[0xfc], -Infinity);
  assert.ok([0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff].every((b) => Number.isNaN(e5[b])));
  assert.equal(e5[0x01], 2 ** -16);
  assert.equal(e5[0x04], 2 ** -14);
  assert.equal(e5[0x3c], 1);
  assert.equal(e5[0x3d], 1.25);
});

const FP8 = [
  { name: "e4m3", table: FP8_E4M3_TABLE, enc: f32ToFp8E4m3, max: 0x7e },
  { name: "e5m2", table: FP8_E5M2_TABLE, enc: f32ToFp8E5m2, max: 0x7b },
];

Deno.test("fp8: every finite byte round-trips", () => {
  for (const f of FP8) {
    for (let b = 0; b < 256; b++) {
      if (Number.isFinite(f.table[b])) assert.equal(f.enc(f.table[b]), b, `${f.name} ${hex(b)}`);
    }
  }
});

Deno.test("fp8: ties go to the even code, off-tie values to the nearer one", () => {
  assert.equal(f32ToFp8E4m3(1.0625), 0x38);
  assert.equal(f32ToFp8E4m3(1.1875), 0x3a);
  assert.equal(f32ToFp8E4m3(2 ** -10), 0x00, "half the smallest subnormal -> 0");
  assert.equal(f32ToFp8E4m3(3 * 2 ** -10), 0x02);
  assert.equal(f32ToFp8E5m2(1.125), 0x3c);
  assert.equal(f32ToFp8E5m2(1.375), 0x3e);
  for (const f of FP8) {
    // Consecutive positive codes 0..max are increasing values; check each gap.
    for (let lo = 0; lo < f.max; lo++) {
      const a = f.table[lo], b = f.table[lo + 1];
      assert.ok(b > a, `${f.name} table increasing at ${hex(lo)}`);
      const mid = (a + b) / 2, eps = (b - a) / 64;
      const even = lo % 2 === 0 ? lo : lo + 1;
      assert.equal(f.enc(mid), even, `${f.name} tie ${a}|${b}`);
      assert.equal(f.enc(-mid), 0x80 | even, `${f.name} tie -(${a}|${b})`);
      assert.equal(f.enc(mid - eps), lo, `${f.name} below tie ${a}|${b}`);
      assert.equal(f.enc(mid + eps), lo + 1, `${f.name} above tie ${a}|${b}`);
    }
  }
});

Deno.test("fp8: saturation and NaN", () => {
  for (const x of [449, 464, 480, 1e9, Infinity]) {
    assert.equal(f32ToFp8E4m3(x), 0x7e, `e4m3 ${x}`);
    assert.equal(f32ToFp8E4m3(-x), 0xfe, `e4m3 ${-x}`);
  }
  for (const x of [57345, 61440, 1e9, Infinity]) {
    assert.equal(f32ToFp8E5m2(x), 0x7b, `e5m2 ${x}`);
    assert.equal(f32ToFp8E5m2(-x), 0xfb, `e5m2 ${-x}`);
  }
  assert.ok(Number.isNaN(FP8_E4M3_TABLE[f32ToFp8E4m3(NaN)]));
  assert.ok(Number.isNaN(FP8_E5M2_TABLE[f32ToFp8E5m2(NaN)]));
  assert.equal(roundTo("fp8_e4m3", 1000), 448);
  assert.equal(roundTo("fp8_e5m2", -1e6), -57344);
});

Deno.test("encode/decode: round trip, rounding, odd-offset views", () => {
  const all: StorageDType[] = ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"];
  const x = Array.from({ length: 37 }, () => (Math.random() - 0.5) * 20);
  for (const d of all) {
    const bytes = encode(d, x);
    assert.equal(bytes.byteLength, x.length * bytesPerElement(d), d);
    const back = decode(d, bytes);
    for (let i = 0; i < x.length; i++) assert.equal(back[i], roundTo(d, x[i]), `${d}[${i}]`);
    // A view at an odd byte offset decodes the same.
    const padded = new Uint8Array(bytes.byteLength + 1);
    padded.set(bytes, 1);
    assert.deepEqual(decode(d, padded.subarray(1)), back, `${d} odd offset`);
  }
  assert.deepEqual([...encode("float16", [1, -2])], [0x00, 0x3c, 0x00, 0xc0], "little-endian");
  assert.equal(resolveStorage("auto", "bfloat16"), "bfloat16");
  assert.equal(resolveStorage("fp8_e5m2", "float16"), "fp8_e5m2");
});

Deno.test("bfloat16: a float64 rounds once, not through float32 (no double rounding)", () => {
  // 1 + 2^-8 is a bf16 tie (between 1 and 1 + 2^-7); a hair above it must round up. Through
  // float32 the hair vanished first and the tie went to even (0x3f80).
  assert.equal(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -30), 0x3f81);
  assert.equal(f32ToBf16Bits(-(1 + 2 ** -8 + 2 ** -30)), 0xbf81);
  assert.equal(f32ToBf16Bits(1 + 2 ** -8), 0x3f80, "the tie itself goes to even");
  assert.equal(f32ToBf16Bits(1 + 3 * 2 ** -8 - 2 ** -30), 0x3f81, "a hair below a tie: down");
  assert.equal(f32ToBf16Bits(3.5e38), 0x7f80, "beyond float32's max: +inf");
  assert.equal(f32ToBf16Bits(1e-50), 0, "far below the smallest subnormal: 0");
  // Against the exact nearest-even choice between the two bf16 neighbours, on random float64s.
  const rng = new Rng(7);
  for (let i = 0; i < 20000; i++) {
    const x = (rng.uniform(-1, 1) < 0 ? -1 : 1) * 2 ** rng.uniform(-30, 30) *
      (1 + rng.uniform(0, 1));
    const f = new Float32Array([x]);
    const b = new Uint32Array(f.buffer)[0];
    const down = (Math.abs(f[0]) > Math.abs(x) ? b - 1 : b) >>> 16; // toward zero
    const lo = bf16BitsToF32(down), hi = bf16BitsToF32(down + 1);
    const dl = Math.abs(x - lo), dh = Math.abs(hi - x);
    const want = dl < dh ? down : dh < dl ? down + 1 : (down & 1 ? down + 1 : down);
    assert.equal(f32ToBf16Bits(x), want, `x = ${x}`);
  }
});
