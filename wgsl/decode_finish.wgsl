// decode_finish.wgsl: the last step of a decode row, shared by the reduce pass
// (decode_reduce.wgsl) and the split pass's epilogue (decode_epilogue.wgsl): from the complete
// (m, l, acc) of query head h of token tok (m the max over every slice, l and acc relative to
// it) the sink joins the denominator,
//   M = max(sink, m), L = l e^(m - M) + e^(sink - M), out = v_scale acc e^(m - M) / L,
//   lse = M + log(L); nothing to attend (L == 0): out = 0, lse = -inf (P.neg_inf). A NaN L (a
// NaN stored in a slot the row reads) is not "nothing": out and lse come out NaN, as in float64.
// Writes output columns 4i .. 4i + 3 (out_put4) and, for i == 0, the LSE. Needs P (has_sink,
// sink_off, v_scale, neg_inf, num_heads, num_tokens), tab, out_put4, lse and D4.
fn finish(tok: u32, h: u32, i: u32, m: f32, l: f32, acc: vec4<f32>) {
  var mx = m;
  var den = l;
  var o = acc;
  if (P.has_sink != 0u) {
    let sink = bitcast<f32>(tab[P.sink_off + h]);
    let m2 = max(mx, sink);
    let a = exp(mx - m2);
    den = den * a + exp(sink - m2);
    o *= a;
    mx = m2;
  }
  let empty = den == 0.0;
  out_put4((tok * P.num_heads + h) * D4 + i, select(o * (P.v_scale / den), vec4<f32>(0.0), empty));
  if (i == 0u) {
    lse[h * P.num_tokens + tok] = select(mx + log(den), P.neg_inf, empty);
  }
}
