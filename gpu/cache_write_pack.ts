/**
 * The WGSL that packs a cache-write kernel's rows into a storage dtype's words: the exactly
 * rounded division {@link DIV_RN} by an fp8 cache's scale and `pack_word` ({@link packFn}).
 * @module
 */
import type { StorageDType } from "../core/types.ts";

/**
 * `div_rn(x, s)`: x / s rounded to the nearest f32, ties to even, as core's reference divides
 * (backends/cpu/reference.ts `writeKv`: fround(x / fround(scale))). WGSL, like Vulkan, lets `/`
 * be off by up to 2.5 ulp, and NVIDIA's quotient is: where x / s sits by an fp8 rounding edge
 * the cache then held the neighbouring code, one code off the reference's (12.5% of the value in
 * e4m3), which moved a soft-capped batch's output past tolerance (bench/NOTES.md v0.19). So the
 * quotient's mantissa is a long division of the two 24-bit mantissas in integers (subnormal
 * operands normalised first: a device may flush them), 24 steps and a rounding test on the
 * remainder, with a subnormal quotient rounded once from the unrounded bits and an overflow
 * infinite: exact on every device and for every finite x and s > 0 (an fma residual is not:
 * lavapipe does not fuse it). Infinite or NaN operands take the device's `/`.
 */
export const DIV_RN =
  `// The 24-bit mantissa of |b| (leading 1 at bit 23) and its exponent field, subnormals normalised.
fn div_rn_unpack(b: u32) -> vec2<i32> {
  let m = b & 0x7fffffu;
  let e = i32((b >> 23u) & 0xffu);
  if (e != 0) {
    return vec2<i32>(i32(m | 0x800000u), e);
  }
  let z = countLeadingZeros(m) - 8u;
  return vec2<i32>(i32(m << z), 1 - i32(z));
}

fn div_rn(x: f32, s: f32) -> f32 {
  let bx = bitcast<u32>(x);
  let ax = bx & 0x7fffffffu;
  let as_ = bitcast<u32>(s) & 0x7fffffffu;
  if (ax >= 0x7f800000u || as_ >= 0x7f800000u || as_ == 0u) {
    return x / s;
  }
  let sign = bx & 0x80000000u; // s > 0
  if (ax == 0u) {
    return x;
  }
  let ux = div_rn_unpack(ax);
  let us = div_rn_unpack(as_);
  let mx = u32(ux.x);
  let ms = u32(us.x);
  var e = ux.y - us.y + 127;
  var rem = mx;
  if (mx < ms) {
    rem = mx << 1u;
    e -= 1;
  }
  var qm = 0u; // the quotient's top 24 bits, truncated
  for (var i = 0u; i < 24u; i++) {
    qm <<= 1u;
    if (rem >= ms) {
      rem -= ms;
      qm |= 1u;
    }
    rem <<= 1u;
  }
  // rem is twice the remainder: against ms it says below, at or above half an ulp.
  if (e >= 1) {
    if (rem > ms || (rem == ms && (qm & 1u) == 1u)) {
      qm += 1u;
      if (qm == 0x1000000u) {
        qm = 0x800000u;
        e += 1;
      }
    }
    if (e >= 255) {
      return bitcast<f32>(sign | 0x7f800000u);
    }
    return bitcast<f32>(sign | (u32(e) << 23u) | (qm & 0x7fffffu));
  }
  // Below the normal range: the mantissa field is qm >> (1 - e), rounded once here.
  let sh = u32(1 - e);
  if (sh > 24u) {
    return bitcast<f32>(sign);
  }
  let kept = qm >> sh;
  let dropped = qm & ((1u << sh) - 1u);
  let half = 1u << (sh - 1u);
  let up = dropped > half || (dropped == half && (rem != 0u || (kept & 1u) == 1u));
  return bitcast<f32>(sign | (kept + select(0u, 1u, up)));
}`;

export function packFn(d: StorageDType): string {
  const head = "fn pack_word(x: vec4<u32>, scale: f32) -> u32 {\n";
  switch (d) {
    case "float32":
      return `${head}  return x.x;\n}\n`;
    case "float16":
      return `${head}  return f16_bits(x.x) | (f16_bits(x.y) << 16u);\n}\n`;
    case "bfloat16":
      return `${head}  return bf16_bits(x.x) | (bf16_bits(x.y) << 16u);\n}\n`;
    case "fp8_e4m3":
    case "fp8_e5m2": {
      const f = d === "fp8_e4m3" ? "e4m3_bits" : "e5m2_bits";
      return `${DIV_RN}
fn scaled(b: u32, scale: f32) -> u32 {
  if (scale == 1.0) {
    return b;
  }
  return bitcast<u32>(div_rn(bitcast<f32>(b), scale));
}
${head}  return ${f}(scaled(x.x, scale)) | (${f}(scaled(x.y, scale)) << 8u) |
    (${f}(scaled(x.z, scale)) << 16u) | (${f}(scaled(x.w, scale)) << 24u);
}
`;
    }
  }
}
