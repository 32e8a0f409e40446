// flash_attention.wgsl: FlashAttention-2 style varlen attention for mixed prefill + decode
// batches over the paged cache (or, when ENC, over the call's own K/V).
//
// One workgroup = one tile (request, up to ROWS query rows) x one KV head. A tile's rows are
// (token, q head) pairs of ONE GQA group: `cnt` consecutive tokens from `first` times
// `hcnt` q heads from `hfirst` (within the group), so every K/V tile is read from memory
// once, decoded to f32 into workgroup memory, and used by all rows. Online softmax in f32.
//
// Bindings (group 0; the Params struct and declarations are generated from
// gpu/flash_kernel.ts's FLASH_ATTENTION entry):
//   0 uniform  U                           runtime sizes and options (struct Params)
//   1 storage  q                           [num_tokens, num_heads, D] in the data dtype
//                                          (read 4 elements at a time by q_4, QLOAD)
//   2 storage  mdw: array<u32>              tiles (4 words each: req, first, cnt | hcnt << 16,
//                                          hfirst), then at U.off_reqs per request 4 words
//                                          (kv_len, bitcast(base - q0), 0, rbase), block table
//                                          at U.off_bt, alibi slopes / sinks (f32 bits)
//   3 storage  out                         [num_tokens, num_heads, D] in the data dtype
//                                          (out_put4, OUT; poisoned before the call)
//   4 storage  lse: array<f32>             [num_heads, num_tokens]
//   5..        cache: k0..k{N-1}, v0..v{N-1} (array<vec4<u32>>, accessors from kvAccessorFns);
//              ENC: k_in, v_in: array<vec4<u32>> [num_tokens, num_kv_heads, D] data-dtype
//              words (decoded like a cache of the data dtype)
// Dispatch: num_tiles * num_kv_heads workgroups of WG, folded into x/y (U.nwg_x).
// Compile-time: WG, ROWS, BK (keys per K/V tile), TPR (threads per row in the PV step), D,
// BS (block size), NHD, V4R (16-byte loads per K/V row), EPW (elements per u32 word), DECODE
// (the K/V dtype's decoders), SOURCE (src_k / src_v: cache or call K/V), QLOAD, OUT.
// Semantics (core/reference.ts): p = base + j; s = (scale * k_scale) q.k, soft cap, ALiBi
// -slope (p - k); causal k <= p (and p - k < w), non-causal |p - k| < w; sinks in the
// denominator only; lse = m + log(denominator), -inf and output 0 with nothing visible.

const WG: u32 = {{WG}};
const ROWS: u32 = {{ROWS}};
const BK: u32 = {{BK}};
const TPR: u32 = {{TPR}};
const D: u32 = {{D}};
const D4: u32 = D / 4u;
const KSTR: u32 = D4 + 1u; // padded K row stride (vec4s): conflict-free column reads
const BS: u32 = {{BS}};
const NHD: bool = {{NHD}};
const V4R: u32 = {{V4R}};
const EPW: u32 = {{EPW}};
const WPR: u32 = D / EPW;
const SPT: u32 = ROWS * BK / WG; // scores per thread
const RSTEP: u32 = WG / BK;
const DPT4: u32 = D4 / TPR; // output vec4s per thread
const MASK: f32 = -3.0e38;
const FLAG_ALIBI: u32 = 1u;
const FLAG_SINKS: u32 = 2u;

{{DECODE}}
{{SOURCE}}
{{QLOAD}}
{{OUT}}

var<workgroup> Qs: array<vec4<f32>, ROWS * D4>;
var<workgroup> Ks: array<vec4<f32>, BK * KSTR>;
var<workgroup> Vs: array<vec4<f32>, BK * D4>;
var<workgroup> Ps: array<f32, ROWS * BK>;
var<workgroup> row_pos: array<i32, ROWS>;
var<workgroup> row_slope: array<f32, ROWS>;
var<workgroup> row_ok: array<u32, ROWS>;
var<workgroup> s_kstart: u32;
var<workgroup> s_kend: u32;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let wid = wg.x + wg.y * U.nwg_x;
  if (wid >= U.num_tiles * U.num_kv_heads) {
    return;
  }
  let tile = wid / U.num_kv_heads;
  let kvh = wid % U.num_kv_heads;
  let req = mdw[tile * 4u];
  let first = mdw[tile * 4u + 1u];
  let cnt = mdw[tile * 4u + 2u] & 0xffffu;
  let hcnt = max(1u, mdw[tile * 4u + 2u] >> 16u);
  let hfirst = mdw[tile * 4u + 3u];
  let rb = U.off_reqs + req * 4u;
  let kv_len = i32(mdw[rb]);
  let bmq = bitcast<i32>(mdw[rb + 1u]); // position of token `tok` is tok + bmq
  let rbase = mdw[rb + 3u];
  let nrows = cnt * hcnt;
  let w = i32(U.window);

  if (t == 0u) {
    let p_first = i32(first) + bmq;
    let p_last = p_first + i32(cnt) - 1;
    var ks = 0;
    var ke = kv_len;
    if (U.window > 0u) {
      ks = max(0, p_first - w + 1);
    }
    if (U.causal != 0u) {
      ke = min(kv_len, p_last + 1);
    } else if (U.window > 0u) {
      ke = min(kv_len, p_last + w);
    }
    s_kstart = u32(ks);
    s_kend = u32(max(ke, ks));
  }
  if (t < ROWS) {
    let tok = first + t / hcnt;
    let h = kvh * U.group + hfirst + t % hcnt;
    row_ok[t] = select(0u, 1u, t < nrows);
    row_pos[t] = i32(tok) + bmq;
    var slope = 0.0;
    if ((U.flags & FLAG_ALIBI) != 0u && t < nrows) {
      slope = bitcast<f32>(mdw[U.off_alibi + h]);
    }
    row_slope[t] = slope;
  }
  for (var idx = t; idx < ROWS * D4; idx += WG) {
    let r = idx / D4;
    var v = vec4<f32>(0.0);
    if (r < nrows) {
      let tok = first + r / hcnt;
      let h = kvh * U.group + hfirst + r % hcnt;
      v = q_4((tok * U.num_heads + h) * D4 + idx % D4) * U.scale_qk;
    }
    Qs[idx] = v;
  }
  workgroupBarrier();
  let kstart = workgroupUniformLoad(&s_kstart);
  let kend = workgroupUniformLoad(&s_kend);

  // PV-step ownership: row r_pv, output vec4s ds, ds + TPR, ...
  let r_pv = t / TPR;
  let ds = t % TPR;
  let pv_ok = r_pv < nrows;
  let h_pv = kvh * U.group + hfirst + r_pv % hcnt;
  var m = MASK;
  var l = 0.0;
  if ((U.flags & FLAG_SINKS) != 0u && pv_ok) {
    m = bitcast<f32>(mdw[U.off_sinks + h_pv]);
    l = 1.0;
  }
  var acc: array<vec4<f32>, DPT4>;
  // Score-step ownership: key j_s of the tile, rows rg, rg + RSTEP, ...
  let j_s = t % BK;
  let rg = t / BK;

  for (var kt = kstart; kt < kend; kt += BK) {
    for (var idx = t; idx < BK * V4R; idx += WG) {
      let j = idx / V4R;
      let c = idx % V4R;
      let key = kt + j;
      var wk = vec4<u32>(0u);
      var wv = vec4<u32>(0u);
      if (key < kend) {
        wk = src_k(key, kvh, c, rbase);
        wv = src_v(key, kvh, c, rbase);
      }
      for (var e = 0u; e < EPW; e++) {
        Ks[j * KSTR + c * EPW + e] = kv_decode16(wk, e);
        Vs[j * D4 + c * EPW + e] = kv_decode16(wv, e);
      }
    }
    workgroupBarrier();

    var s = array<f32, SPT>();
    for (var c = 0u; c < D4; c++) {
      let kv = Ks[j_s * KSTR + c];
      for (var i = 0u; i < SPT; i++) {
        s[i] += dot(Qs[(rg + RSTEP * i) * D4 + c], kv);
      }
    }
    let key = kt + j_s;
    for (var i = 0u; i < SPT; i++) {
      let r = rg + RSTEP * i;
      var x = s[i];
      if (U.softcap > 0.0) {
        x = U.softcap * tanh(clamp(x / U.softcap, -15.0, 15.0));
      }
      let dk = row_pos[r] - i32(key);
      x -= row_slope[r] * f32(dk);
      var vis = row_ok[r] != 0u && key < kend;
      if (U.causal != 0u) {
        vis = vis && dk >= 0 && (U.window == 0u || dk < w);
      } else if (U.window > 0u) {
        vis = vis && abs(dk) < w;
      }
      Ps[r * BK + j_s] = select(MASK, x, vis);
    }
    workgroupBarrier();

    var tmax = MASK;
    for (var j = 0u; j < BK; j++) {
      tmax = max(tmax, Ps[r_pv * BK + j]);
    }
    let mn = max(m, tmax);
    if (mn > -1.0e38) {
      let alpha = exp(m - mn);
      for (var i = 0u; i < DPT4; i++) {
        acc[i] *= alpha;
      }
      var psum = 0.0;
      for (var j = 0u; j < BK; j++) {
        let p = exp(Ps[r_pv * BK + j] - mn);
        psum += p;
        for (var i = 0u; i < DPT4; i++) {
          acc[i] += p * Vs[j * D4 + ds + TPR * i];
        }
      }
      l = l * alpha + psum;
      m = mn;
    }
    workgroupBarrier();
  }

  if (pv_ok) {
    let tok = first + r_pv / hcnt;
    let inv = select(0.0, U.v_scale / l, l > 0.0);
    let o = (tok * U.num_heads + h_pv) * D4 + ds;
    for (var i = 0u; i < DPT4; i++) {
      out_put4(o + TPR * i, acc[i] * inv);
    }
    if (ds == 0u) {
      lse[h_pv * U.num_tokens + tok] = select(bitcast<f32>(0xff800000u | (U.flags & 0u)), m + log(l), l > 0.0);
    }
  }
}
