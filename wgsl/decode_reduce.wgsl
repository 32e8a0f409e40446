// decode_reduce.wgsl: the reduce pass of flash decoding for WEBGPU_DECODE. Combines the
// split partials of one (token, head) by their max and sum, adds the sink to the
// denominator (once, here), normalises and writes the output row and the LSE:
//   M = max(sink, m_s),  L = e^(sink - M) + sum_s l_s e^(m_s - M),
//   out = v_scale * sum_s acc_s e^(m_s - M) / L,  lse = M + log(L).
// Nothing to attend (L == 0): out = 0, lse = -inf (P.neg_inf).
//
// Bindings (group 0):
//   0 uniform  P      : Params                 the same block as decode_split.wgsl
//   1 storage  tab    : [..] u32   token table at P.tok_off: [num_tokens * 2] (first slot,
//                                  slot count); sinks at P.sink_off: [num_heads] f32 bits
//   2 storage  part   : [num_slots * num_heads * D / 4 + num_slots * num_heads] vec4<f32>
//                       acc at (slot * H + h) * D / 4, (m, l, 0, 0) at P.ml_off + slot * H + h
//   3 storage  result : [num_tokens * num_heads * D + num_heads * num_tokens] f32, read_write:
//                       output [num_tokens, num_heads, D] at 0, lse [num_heads, num_tokens]
//                       at P.lse_off (poisoned with NaN by the host before the call)
// Dispatch: num_tokens * num_heads workgroups of D / 4 invocations, folded into (x, y):
//   id = wg.x + wg.y * P.nwg_x_reduce; token = id / num_heads, head = id % num_heads;
//   invocation i writes output elements 4i .. 4i + 3.
// Compile-time: D (head size).

struct Params {
  num_tokens: u32,
  num_heads: u32,
  num_kv_heads: u32,
  group: u32,
  num_items: u32,
  head_tiles: u32,
  max_blocks: u32,
  block_size: u32,
  bt_off: u32,
  slope_off: u32,
  tok_off: u32,
  sink_off: u32,
  ml_off: u32,
  lse_off: u32,
  nwg_x: u32,
  nwg_x_reduce: u32,
  block_words: u32,
  blocks_per_chunk: u32,
  score_scale: f32,
  soft_cap: f32,
  v_scale: f32,
  has_sink: u32,
  neg_inf: f32,
  pad0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> tab: array<u32>;
@group(0) @binding(2) var<storage, read> part: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> result: array<f32>;

const D: u32 = {{D}};
const D4: u32 = D / 4u;
const NEG: f32 = -1.0e30; // the split pass's finite "minus infinity"

@compute @workgroup_size(D4)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) i: u32) {
  let id = wg.x + wg.y * P.nwg_x_reduce;
  let H = P.num_heads;
  if (id >= P.num_tokens * H) {
    return;
  }
  let tok = id / H;
  let h = id % H;
  let first = tab[P.tok_off + 2u * tok];
  let n = tab[P.tok_off + 2u * tok + 1u];
  let has_sink = P.has_sink != 0u;
  let sink = bitcast<f32>(tab[P.sink_off + h]);
  var mx = select(NEG, sink, has_sink);
  for (var s = 0u; s < n; s++) {
    mx = max(mx, part[P.ml_off + (first + s) * H + h].x);
  }
  var den = select(0.0, exp(sink - mx), has_sink);
  var o = vec4<f32>(0.0);
  for (var s = 0u; s < n; s++) {
    let slot = first + s;
    let ml = part[P.ml_off + slot * H + h];
    let w = select(0.0, exp(ml.x - mx), ml.y > 0.0);
    den += ml.y * w;
    o += part[(slot * H + h) * D4 + i] * w;
  }
  let empty = !(den > 0.0);
  let r = select(o * (P.v_scale / den), vec4<f32>(0.0), empty);
  let ob = (tok * H + h) * D + 4u * i;
  result[ob] = r.x;
  result[ob + 1u] = r.y;
  result[ob + 2u] = r.z;
  result[ob + 3u] = r.w;
  if (i == 0u) {
    result[P.lse_off + h * P.num_tokens + tok] = select(mx + log(den), P.neg_inf, empty);
  }
}
