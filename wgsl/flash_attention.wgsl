// flash_attention.wgsl: FlashAttention-2 style varlen attention for prefill rows over the
// paged cache (or, when ENC, over the call's own K/V), register-tiled for FMA throughput.
//
// One workgroup = one tile of BQ = TY * RM query rows x one KV head. A tile's rows are
// (token, q head) pairs of ONE GQA group: `cnt` consecutive tokens from `first` times `hcnt`
// q heads from `hfirst` (within the group), so each K/V tile is read once for all of them.
// Query rows, scaled, sit in workgroup memory (Qs, [D4][BQ] vec4<f32>) for the whole call.
// Per key tile of BK = TX * RN keys:
//   1. the tile's K, loaded into registers one tile ahead, is decoded to f32 into KVs;
//   2. the V loads of the tile are issued (into registers);
//   3. S = Q K^T: thread (tx, ty) accumulates rows ty + TY m x keys tx + TX n (RM x RN
//      scores) over D in registers, from RM + RN vec4 loads per 4 x RM x RN FMAs;
//   4. soft cap, ALiBi, and (only in tiles some row cannot fully see) the mask; each thread's
//      row maxima go to `red`;
//   5. V replaces K in KVs; each row's new max (over the TX partials), the rescale factor and
//      the probabilities (into Ps); the next tile's K loads are issued;
//   6. O = O * alpha + P V: rows ty + TY m x vec4 columns tx + TX i (RM x CV vec4s).
// Four barriers per key tile, f32 arithmetic and accumulation throughout; each thread keeps
// its own partial softmax sums, added once at the end.
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
// Dispatch: num_tiles * num_kv_heads workgroups of WG = TX * TY, folded into x/y (U.nwg_x).
// Compile-time: TX, TY, RM, RN (the register tile), D, BS (block size), NHD, V4R (16-byte
// loads per K/V row), EPW (elements per u32 word), TILE (flash_tile.wgsl: the tile's request,
// tokens, heads and request words), DECODE (the K/V dtype's decoders), SOURCE
// (src_k / src_v: cache or call K/V), QLOAD, OUT, and the generated fragments of
// gpu/flash_codegen.ts (ROWS .. FINISH; CAP and ALIBI are compiled into SCALE).
// Semantics (core/reference.ts): p = base + j; s = (scale * k_scale) q.k, soft cap, ALiBi
// -slope (p - k); causal k <= p (and p - k < w), non-causal |p - k| < w; sinks in the
// denominator only; lse = m + log(denominator), -inf and output 0 with nothing visible.

const TX: u32 = {{TX}};
const TY: u32 = {{TY}};
const WG: u32 = TX * TY;
const BQ: u32 = TY * {{RM}};
const BK: u32 = TX * {{RN}};
const D: u32 = {{D}};
const D4: u32 = D / 4u;
const KSTR: u32 = D4 + 1u; // padded K/V row stride (vec4s): conflict-free column reads
const PSTR4: u32 = (BK + TX) / 4u; // padded Ps row stride (vec4s)
const TX4: u32 = TX / 4u; // vec4s of row partials per row
const BS: u32 = {{BS}};
const NHD: bool = {{NHD}};
const V4R: u32 = {{V4R}};
const EPW: u32 = {{EPW}};
const WPR: u32 = D / EPW;
const MASK: f32 = -3.0e38;
const HALF_MASK: f32 = -1.0e38;
const FLAG_SINKS: u32 = 2u;

{{DECODE}}
{{SOURCE}}
{{QLOAD}}
{{OUT}}

var<workgroup> Qs: array<array<vec4<f32>, BQ>, D4>; // scaled queries [column][row]
var<workgroup> KVs: array<array<vec4<f32>, KSTR>, BK>; // K, then V [key][column]
var<workgroup> Ps: array<array<vec4<f32>, PSTR4>, BQ>; // probabilities [row][key / 4]
var<workgroup> red: array<array<vec4<f32>, TX4>, BQ>; // row partials (max, then sum) [row][tx / 4]

{{TANH_REL}}

fn hmax(v: vec4<f32>) -> f32 {
  return max(max(v.x, v.y), max(v.z, v.w));
}

// Whether the row at position `pos` sees key `key` (below kend).
fn visible(pos: i32, key: u32, kend: u32) -> bool {
  let dk = pos - i32(key);
  var vis = key < kend;
  if (U.causal != 0u) {
    vis = vis && dk >= 0 && (U.window == 0u || dk < i32(U.window));
  } else if (U.window > 0u) {
    vis = vis && abs(dk) < i32(U.window);
  }
  return vis;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
{{TILE}}
  let sinks = (U.flags & FLAG_SINKS) != 0u;
  let tx = t % TX;
  let ty = t / TX;

  // The tile's key range, and the keys every row of it sees (no mask needed below them).
  let p_first = i32(first) + bmq;
  let p_last = p_first + i32(cnt) - 1;
  var ks = 0;
  var ke = i32(kv_len);
  if (U.window > 0u) {
    ks = max(0, p_first - w + 1);
  }
  if (U.causal != 0u) {
    ke = min(i32(kv_len), p_last + 1);
  } else if (U.window > 0u) {
    ke = min(i32(kv_len), p_last + w);
  }
  let kstart = u32(ks);
  let kend = u32(max(ke, ks));

  for (var idx = t; idx < BQ * D4; idx += WG) {
    let r = idx / D4;
    let c = idx % D4;
    var v = vec4<f32>(0.0);
    if (r < nrows) {
      let tok = first + r / hcnt;
      let h = kvh * U.group + hfirst + r % hcnt;
      v = q_4((tok * U.num_heads + h) * D4 + c) * U.scale_qk;
    }
    Qs[c][r] = v;
  }
{{ROWS}}
{{STATE}}
{{SLOTS}}
  var kt0 = kstart;
  {
{{LOAD_K}}
  }

  for (var kt = kstart; kt < kend; kt += BK) {
{{STORE_K}}
    workgroupBarrier();
    kt0 = kt;
{{LOAD_V}}
{{SDECL}}
{{SCORE}}
{{SCALE}}
    // A tile every row sees whole needs no mask (most tiles of a long causal prefill).
    var full = kt + BK <= kend;
    if (U.causal != 0u) {
      full = full && i32(kt + BK) - 1 <= p_first && (U.window == 0u || p_last - i32(kt) < w);
    } else if (U.window > 0u) {
      full = full && p_last - i32(kt) < w && i32(kt + BK) - 1 - p_first < w;
    }
    if (!full) {
{{MASK}}
    }
{{PMAX}}
    workgroupBarrier();
{{STORE_V}}
{{SOFTMAX}}
    kt0 = kt + BK;
{{LOAD_K}}
    workgroupBarrier();
{{PV}}
    workgroupBarrier();
  }
{{FINISH}}
}
