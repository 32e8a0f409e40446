// flash_mma_rows.wgsl: per-row helpers of flash_mma.wgsl, pasted into it at {{HELPERS}} (they use
// its constants, uniforms and workgroup arrays): which key tiles a subgroup's rows can see, the
// score of one (row, key), a tile's block ids, and the rescale of the lane-owned parts of an O
// pass in s_s (the epilogue's write_rows is generated: gpu/flash_mma_codegen.ts writeRowsCode).
// No bindings, no placeholders.

// The keys some position in [p0, p1] sees: [x, y) (y <= x: none).
fn key_range(p0: i32, p1: i32, kv_len: u32) -> vec2<i32> {
  let w = i32(U.window);
  var ks = 0;
  var ke = i32(kv_len);
  if (U.window > 0u) {
    ks = max(0, p0 - w + 1);
  }
  if (U.causal != 0u) {
    ke = min(ke, p1 + 1);
  } else if (U.window > 0u) {
    ke = min(ke, p1 + w);
  }
  return vec2<i32>(ks, ke);
}

// Keys [kt, kt + BK) hold one visible to some position in [p_lo, p_hi]?
fn tile_live(kt: u32, p_lo: i32, p_hi: i32) -> bool {
  let k0 = i32(kt);
  let k1 = k0 + i32(BK) - 1;
  let w = i32(U.window);
  if (U.causal != 0u) {
    return k0 <= p_hi && (U.window == 0u || k1 > p_lo - w);
  }
  return U.window == 0u || (k0 < p_hi + w && k1 > p_lo - w);
}

// The scaled, capped, biased score of position `pos` for `key`; MASK where it is not visible.
fn score(s: f32, pos: i32, slope: f32, key: u32, kend: u32) -> f32 {
  var x = s * U.scale_qk;
  if (U.softcap > 0.0) {
    // clamp() would make a NaN (from a NaN stored in the cache) +-15: it stays NaN, as in float64.
    let nan = (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
    x = select(U.softcap * tanh_rel(clamp(x / U.softcap, -15.0, 15.0)), x, nan);
  }
  let dk = pos - i32(key);
  x -= slope * f32(dk);
  var vis = key < kend;
  if (U.causal != 0u) {
    vis = vis && dk >= 0 && (U.window == 0u || dk < i32(U.window));
  } else if (U.window > 0u) {
    vis = vis && abs(dk) < i32(U.window);
  }
  return select(MASK, x, vis);
}

// Block id `i` of the tile starting at key kt (0 past the request's blocks).
fn blk_of(kt: u32, i: u32, kv_len: u32, rbase: u32) -> u32 {
  let b = kt / BS + i;
  if (b * BS >= kv_len) {
    return 0u;
  }
  return mdw[U.off_bt + rbase + b];
}

// Scales this lane's part of its rows in the O pass held in s_s.
fn scale_rows(sgr: u32, ln: u32, alpha: array<f32, RPL>) {
  for (var i = 0u; i < RPL; i++) {
    let b = (sgr + ln / LPR + i * (SG / LPR)) * SSTR + (ln % LPR) * KPL;
    for (var e = 0u; e < KPL; e++) {
      s_s[b + e] *= alpha[i];
    }
  }
}

// Every key of [kt, kt + BK) below kend visible to every position in [p0, p1]? A tile that is
// not (the causal diagonal's, a window start's) has keys some rows give p = 0, and 0 x Inf is
// NaN in P V: its non-finite values are staged as 0 (v_finite) and put back at the end.
fn tile_whole(kt: u32, p0: i32, p1: i32) -> bool {
  let k0 = i32(kt);
  let k1 = k0 + i32(BK) - 1;
  let w = i32(U.window);
  if (U.causal != 0u) {
    return k1 <= p0 && (U.window == 0u || k0 > p1 - w);
  }
  return U.window == 0u || (k0 > p1 - w && k1 < p0 + w);
}

// `x` with its infinities and NaNs made 0, noted in s_u[3] for the epilogue's value_specials.
fn v_finite(x: vec4<f16>) -> vec4<f16> {
  let b = bitcast<vec2<u32>>(x);
  let lo = (b & vec2<u32>(0x7c00u)) == vec2<u32>(0x7c00u);
  let hi = (b & vec2<u32>(0x7c000000u)) == vec2<u32>(0x7c000000u);
  if (any(lo) || any(hi)) {
    atomicOr(&s_u[3], 1u);
  }
  let keep = select(vec2<u32>(0xffffu), vec2<u32>(0u), lo) |
             select(vec2<u32>(0xffff0000u), vec2<u32>(0u), hi);
  return bitcast<vec4<f16>>(b & keep);
}

// One element as v_finite does it.
fn v_finite1(x: f16) -> f16 {
  return v_finite(vec4<f16>(x, f16(0.0), f16(0.0), f16(0.0))).x;
}

// Per f16 of a pair: 1 for +Inf, 2 for -Inf, 4 for NaN, 0 for a finite value.
fn value_class(x: vec2<f16>) -> vec2<u32> {
  let b = bitcast<u32>(x);
  let hb = vec2<u32>(b & 0xffffu, b >> 16u);
  let special = (hb & vec2<u32>(0x7c00u)) == vec2<u32>(0x7c00u);
  let nan = (hb & vec2<u32>(0x3ffu)) != vec2<u32>(0u);
  let neg = (hb & vec2<u32>(0x8000u)) != vec2<u32>(0u);
  let inf = select(vec2<u32>(1u), vec2<u32>(2u), neg);
  return select(vec2<u32>(0u), select(inf, vec2<u32>(4u), nan), special);
}
