// round.wgsl: f32 bits -> f16 / bf16 / fp8 bits, round to nearest even, in integer
// arithmetic (byte-exact with core/dtype.ts). Included by kernels that write a storage or data
// dtype narrower than f32 (cache_write, the attention kernels' outputs). No bindings.

// f32 bits -> f16 bits, round to nearest even; overflow -> inf; NaN -> sign | 0x7e00.
fn f16_bits(b: u32) -> u32 {
  let s = (b >> 16u) & 0x8000u;
  let e = (b >> 23u) & 0xffu;
  let m = b & 0x7fffffu;
  if (e == 0xffu) {
    return s | select(0x7c00u, 0x7e00u, m != 0u);
  }
  if (e >= 143u) {
    return s | 0x7c00u;
  }
  if (e >= 113u) {
    let h = ((e - 112u) << 10u) | (m >> 13u);
    let rem = m & 0x1fffu;
    let up = rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u);
    return s | (h + select(0u, 1u, up));
  }
  if (e < 102u) {
    return s;
  }
  let full = m | 0x800000u;
  let shift = 126u - e;
  let h = full >> shift;
  let rem = full & ((1u << shift) - 1u);
  let half = 1u << (shift - 1u);
  let up = rem > half || (rem == half && (h & 1u) == 1u);
  return s | (h + select(0u, 1u, up));
}

// f32 bits -> bf16 bits, round to nearest even; NaN keeps its top bits and gets quiet.
fn bf16_bits(b: u32) -> u32 {
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu) != 0u) {
    return ((b >> 16u) | 0x40u) & 0xffffu;
  }
  return ((b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u) & 0xffffu;
}

// Rounds |a| (f32 bits, finite, below the saturation point) to an fp8 code with MB mantissa
// bits: normal from f32 exponent `emin` (code exponent 1), subnormal below.
fn fp8_round(a: u32, mb: u32, emin: u32) -> u32 {
  let e = a >> 23u;
  let m = a & 0x7fffffu;
  let drop = 23u - mb;
  if (e >= emin) {
    let c = ((e - emin + 1u) << mb) | (m >> drop);
    let rem = m & ((1u << drop) - 1u);
    let half = 1u << (drop - 1u);
    let up = rem > half || (rem == half && (c & 1u) == 1u);
    return c + select(0u, 1u, up);
  }
  // subnormal: code = full * 2^(e - emin + 1 - drop), i.e. a right shift of drop + emin - e
  let shift = drop + emin - e;
  if (shift > 24u) {
    return 0u;
  }
  let full = m | 0x800000u;
  let c = full >> shift;
  let rem = full & ((1u << shift) - 1u);
  let half = 1u << (shift - 1u);
  let up = rem > half || (rem == half && (c & 1u) == 1u);
  return c + select(0u, 1u, up);
}

// f32 bits -> fp8 e4m3fn: saturating at 448 (0x7e), NaN -> 0x7f.
fn e4m3_bits(b: u32) -> u32 {
  let s = (b >> 24u) & 0x80u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) {
    return 0x7fu;
  }
  if (a >= 0x43e00000u) {
    return s | 0x7eu;
  }
  return s | fp8_round(a, 3u, 121u);
}

// f32 bits -> fp8 e5m2: saturating at 57344 (0x7b), NaN -> 0x7f.
fn e5m2_bits(b: u32) -> u32 {
  let s = (b >> 24u) & 0x80u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) {
    return 0x7fu;
  }
  if (a >= 0x47600000u) {
    return s | 0x7bu;
  }
  return s | fp8_round(a, 2u, 113u);
}
