// decode_words.wgsl: the split-KV decode kernel's storage-dtype word decoders (included by
// decode_split.wgsl as WORDS; gpu/decode_codegen.ts DECODERS applies them to the words of a
// vec4<u32>). Core WGSL only. Each returns the elements of one u32 word as f32, in element
// order (the pair decoders e4m3x4s / e5m2x4s at the end: (0, 2, 1, 3)), divided by DECODE_SCALE
// of its dtype (fp8 e4m3: 2^8; the others: 1).
//
// Half words go through unpack2x16float: naga mistypes bitcast<vec2<f16>>(u32).
fn bf2(x: u32) -> vec2<f32> {
  return vec2<f32>(bitcast<f32>(x << 16u), bitcast<f32>(x & 0xffff0000u));
}
// e5m2 is the high byte of an f16: widen each byte pair into an f16 pair.
fn e5m2x4(x: u32) -> vec4<f32> {
  let lo = ((x & 0xffu) << 8u) | ((x & 0xff00u) << 16u);
  let hi = ((x >> 8u) & 0xff00u) | (x & 0xff000000u);
  return vec4<f32>(unpack2x16float(lo), unpack2x16float(hi));
}
// e4m3fn: bias 7, no infinities, S.1111.111 is NaN; subnormals decoded exactly.
fn e4m3x4_exact(x: u32) -> vec4<f32> {
  let b = (vec4<u32>(x) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
  let s = (b & vec4<u32>(0x80u)) << vec4<u32>(24u);
  let em = b & vec4<u32>(0x7fu);
  let normal = s | ((em << vec4<u32>(20u)) + vec4<u32>(120u << 23u));
  let sub = s | bitcast<vec4<u32>>(vec4<f32>(em) * 0.001953125);
  let r = bitcast<vec4<f32>>(select(normal, sub, em < vec4<u32>(8u)));
  // NaN built at run time: Dawn refuses a NaN constant expression.
  let nan = bitcast<vec4<f32>>(vec4<u32>(0x7fc00000u | (x & 0u)));
  return select(r, nan, em == vec4<u32>(0x7fu));
}
// e4m3fn bytes moved into f16 bit positions (exponent bias 15 instead of 7), so every value,
// subnormals included, comes out exactly 2^-8 times the e4m3 value: a few integer ops and
// unpack2x16float per two elements. The plan multiplies the score and value scales by 2^8
// (DECODE_SCALE). A NaN byte (S.1111.111) takes the exact decoder.
fn e4m3x4(x: u32) -> vec4<f32> {
  if ((((x & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0u) {
    return e4m3x4_exact(x) * 0.00390625;
  }
  return e4m3x4f(x);
}


// The same values in the order (0, 2, 1, 3) (tuning `fp8_pairs`): the even bytes and the odd
// bytes each move into f16 positions with one mask and shift per field, no byte gathering.
// e4m3fn: the f16-position decoder (2^-8 of the value), branch-free: a NaN byte (S.1111.111,
// found by the carry of its low 7 bits + 1) gets the f16 exponent all ones (a NaN) OR-ed in.
fn e4m3x4s(x: u32) -> vec4<f32> {
  let n = ((x & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  let ev = ((x & 0x007f007fu) << 7u) | ((x & 0x00800080u) << 8u) |
    (((n & 0x00800080u) >> 7u) * 0x7c00u);
  let od = ((x & 0x7f007f00u) >> 1u) | (x & 0x80008000u) | (((n & 0x80008000u) >> 15u) * 0x7c00u);
  return vec4<f32>(unpack2x16float(ev), unpack2x16float(od));
}
// The same two for a cache known to hold no NaN byte (gpu/kv_cache.ts `fp8_nan_free`: created
// empty and written only by the cache writer, which saturates and gets finite inputs, or imported
// bytes that were checked): no NaN fix-up, about half the integer ops. e4m3x4 above is e4m3x4f
// with the NaN bytes' branch.
fn e4m3x4f(x: u32) -> vec4<f32> {
  let lo = (x & 0xffu) | ((x & 0xff00u) << 8u);
  let hi = ((x >> 16u) & 0xffu) | ((x >> 8u) & 0xff0000u);
  let l = ((lo & 0x007f007fu) << 7u) | ((lo & 0x00800080u) << 8u);
  let h = ((hi & 0x007f007fu) << 7u) | ((hi & 0x00800080u) << 8u);
  return vec4<f32>(unpack2x16float(l), unpack2x16float(h));
}
fn e4m3x4sf(x: u32) -> vec4<f32> {
  let ev = ((x & 0x007f007fu) << 7u) | ((x & 0x00800080u) << 8u);
  let od = ((x & 0x7f007f00u) >> 1u) | (x & 0x80008000u);
  return vec4<f32>(unpack2x16float(ev), unpack2x16float(od));
}
// e5m2: each byte is the high byte of an f16.
fn e5m2x4s(x: u32) -> vec4<f32> {
  return vec4<f32>(unpack2x16float((x & 0x00ff00ffu) << 8u), unpack2x16float(x & 0xff00ff00u));
}
