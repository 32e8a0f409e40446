// decode_epilogue.wgsl: how a split workgroup of decode_split.wgsl ends under EPI > 0 (tunings
// `direct_single`, `fused_reduce`). Appended to decode_split.wgsl ({{EPILOGUE}}) with one of
// decode_partial.wgsl (EPI 1: `partial` stores the slice's partial for the reduce pass) or
// decode_fused.wgsl (EPI 2: the reduce fused into this pass). Called by the generated STORE
// once the key groups are merged, in workgroup-uniform control flow:
//   wacc[f * D4 + i] = the merged accumulator of flat head f (columns 4i .. 4i + 3), relative to
//   wfin[f] = (m, l): the running max and the sum of e^(s - m) over the slice's keys.
// A row cut into one slice (its item's row field NONE) is complete here: decode_finish.wgsl's
// `finish` (the reduce pass's last step) on its one partial, output and LSE written here.
// Bindings used (decode_split.wgsl's header): P, tab (sinks at P.sink_off, the row table at
// P.tok_off: [rows * 4] (token, first slot, slot count, first counter)), out (out_put4,
// generated), lse; decode_partial / decode_fused add part and cnt.

const NONE: u32 = 0xffffffffu;

// The end of the workgroup of items `item` (WT of them under `wg_tokens`; `tok` is its key
// group's token) / `slot` / `row` (row-table entry; NONE: each item one slice, as every item is
// under WT > 1, whose callers pass NONE), query heads hq0 .. hq0 + F - 1, `grp` = its (kv head
// block, head tile) index among per_item. Under NONE flat head f is query head hq0 + f % (F WH)
// of item item * WT + f / (F WH) (WT is 1 with WH > 1).
fn epilogue(item: u32, tok: u32, slot: u32, row: u32, hq0: u32, grp: u32, lid: u32) {
  if (row == NONE) {
    for (var i = lid; i < FW * D4; i += WG) {
      let f = i / D4;
      let t = tab[(item * WT + f / (F * WH)) * 8u + 1u];
      finish(t, hq0 + f % (F * WH), i % D4, wfin[f].x, wfin[f].y, wacc[i]);
    }
    return;
  }
  partial(tok, slot, row, hq0, grp, lid);
}
