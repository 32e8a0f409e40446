// decode_reduce.wgsl: the reduce pass of flash decoding for WEBGPU_DECODE. Combines the
// split partials of one (token, head) by their max and sum,
//   m = max_s m_s,  l = sum_s l_s e^(m_s - m),  acc = sum_s acc_s e^(m_s - m),
// then decode_finish.wgsl's `finish` adds the sink to the denominator (once, here), normalises
// and writes the output row and the LSE (nothing to attend: out = 0, lse = -inf).
//
// Bindings (group 0; the Params struct and declarations are generated from
// gpu/decode_kernels.ts's DECODE_REDUCE entry):
//   0 uniform  P      : Params                 the same fields as decode_split.wgsl
//   1 storage  tab    : [..] u32   row table at P.tok_off: [num_rows * 4] (token, first slot,
//                                  slot count, 0); sinks at P.sink_off: [num_heads] f32 bits
//   2 storage  part   : [num_slots * num_heads * D / 4 + num_slots * num_heads] vec4<f32>
//                       acc at (slot * H + h) * D / 4, (m, l, 0, 0) at P.ml_off + slot * H + h
//   3 storage  out    : [num_tokens, num_heads, D] in the data dtype (out_put4, generated;
//                       poisoned before the call); only the rows of the row table are written
//   4 storage  lse    : [num_heads, num_tokens] f32
// Dispatch: num_rows * num_heads workgroups of D / 4 invocations, folded into (x, y):
//   id = wg.x + wg.y * P.nwg_x_reduce; row = id / num_heads, head = id % num_heads;
//   invocation i writes output elements 4i .. 4i + 3.
// Compile-time: D (head size), OUT (the output dtype's store and rounding helpers, then
// decode_finish.wgsl).

{{OUT}}
const D: u32 = {{D}};
const D4: u32 = D / 4u;
const NEG: f32 = -1.0e30; // the split pass's finite "minus infinity"

@compute @workgroup_size(D4)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) i: u32) {
  let id = wg.x + wg.y * P.nwg_x_reduce;
  let H = P.num_heads;
  if (id >= P.num_rows * H) {
    return;
  }
  let row = id / H;
  let h = id % H;
  let tok = tab[P.tok_off + 4u * row];
  let first = tab[P.tok_off + 4u * row + 1u];
  let n = tab[P.tok_off + 4u * row + 2u];
  var mx = NEG;
  for (var s = 0u; s < n; s++) {
    mx = max(mx, part[P.ml_off + (first + s) * H + h].x);
  }
  var den = 0.0;
  var o = vec4<f32>(0.0);
  for (var s = 0u; s < n; s++) {
    let slot = first + s;
    let ml = part[P.ml_off + slot * H + h];
    let w = select(exp(ml.x - mx), 0.0, ml.y == 0.0); // empty slices weigh 0; NaN ones count
    den += ml.y * w;
    o += part[(slot * H + h) * D4 + i] * w;
  }
  finish(tok, h, i, mx, den, o);
}
