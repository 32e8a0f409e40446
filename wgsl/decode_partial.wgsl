// decode_partial.wgsl: a split workgroup of several key groups stores its slice's partial (acc and
// (m, l, 0, 0), decode_split.wgsl's part layout) for decode_reduce.wgsl, from the merged state in
// wacc / wfin: every slice under EPI 0 (appended alone), a slice of a row cut into several under
// EPI 1 (with decode_epilogue.wgsl, whose `epilogue` calls it).
fn partial(tok: u32, slot: u32, row: u32, hq0: u32, grp: u32, lid: u32) {
  let base = slot * P.num_heads + hq0;
  for (var i = lid; i < FW * D4; i += WG) {
    part[base * D4 + i] = wacc[i];
  }
  for (var f = lid; f < FW; f += WG) {
    part[P.ml_off + base + f] = vec4<f32>(wfin[f], 0.0, 0.0);
  }
}
