// decode_fused.wgsl (EPI 2, with decode_epilogue.wgsl): the reduce fused into the split pass
// (tuning `fused_reduce`). The slices of a row cut into n > 1 meet at a counter, one per (row,
// grp): each workgroup draws a ticket, atomicAdd(counter, 1). The one that draws n - 1 arrived
// last: it resets the counter, reads the other n - 1 partials, merges them with its own (still
// in wacc / wfin, never stored) as decode_reduce.wgsl would, and writes the output and LSE
// (`finish`). The others store their partial and end. One dispatch instead of two.
//
// Memory ordering. WGSL has no device-scope release/acquire: its atomics are relaxed, and
// storageBarrier orders memory among the invocations of one workgroup only (Tint emits it at
// Workgroup memory scope). So a counter alone would not make the partial another workgroup
// stored before its ticket visible to the last one: CUDA's "last block" pattern needs
// __threadfence() for exactly this, and an NVIDIA GPU may let another SM see a workgroup's
// atomic before its plain stores. This file relies only on what WGSL guarantees, the coherence
// of each atomic location:
//  - Every partial word is an atomic<u32> holding (f32 bits) ^ XM. XM is a signalling-NaN
//    pattern, which no arithmetic produces (GPUs return quiet NaNs), so a stored word is never
//    0: a 0 word is "not written in this dispatch".
//  - Invariant between dispatches: every word of `part` (partials and counters) is 0. The
//    buffer is the device's own (gpu/persistent_buffers.ts: never pooled with other scratch,
//    zero when created, as WebGPU creates every buffer), and each dispatch restores the zeros:
//    the last workgroup of a group resets its counter and every partial word it read.
//    Dispatches that bind the buffer writable never overlap (WebGPU orders them), so the next
//    dispatch starts from zeros.
//  - In a dispatch each partial word has one writer (the slice owning the slot, unless it
//    drew the last ticket) and one reader (the last of its group). The reader loads the words
//    of every other slice with atomicLoad and repeats its whole merge while any word it used
//    was 0. The word's modification order is 0, the writer's value, the reader's reset: a
//    nonzero load is this dispatch's value, never a stale one, and the reset (after that load
//    in program order, same location) is ordered after the writer's store. Coherence makes the
//    writer's store visible eventually; the writer drew its ticket before storing, so it is
//    running and waits for nothing: no deadlock. The retry is bounded (SPIN passes); past it
//    the merge uses what it read, a 0 word decodes to NaN, and the output shows NaN instead of
//    the device hanging.
//  - The counter: atomicAdd is a read-modify-write, so the n tickets of a group are 0 .. n - 1
//    in some order; exactly one workgroup is last, and its reset to 0 comes after all n
//    increments in the counter's modification order.
// In practice the stores have landed when the last ticket is drawn and the merge runs once.
// The ticket goes through workgroupUniformLoad, and the (m, l) words, which the D4 lanes of a
// head all read, are reset after a workgroupBarrier: control flow stays workgroup-uniform.
//
// Bindings: part : array<atomic<u32>>, decode_split.wgsl's part layout in u32 words, then the
//                  counters at word P.cnt_off: one per (row of several slices, grp), the row's
//                  first at the row table's 4th field.

const XM: u32 = 0x7fa5a5a5u;
const SPIN: u32 = 4096u;
var<workgroup> wtk: u32;

fn put_word(w: u32, x: f32) {
  atomicStore(&part[w], bitcast<u32>(x) ^ XM);
}

fn take_word(w: u32) -> u32 {
  return atomicLoad(&part[w]);
}

fn partial(tok: u32, slot: u32, row: u32, hq0: u32, grp: u32, lid: u32) {
  let H = P.num_heads;
  let rt = P.tok_off + 4u * row;
  let n = tab[rt + 2u];
  let c = P.cnt_off + tab[rt + 3u] + grp;
  if (lid == 0u) {
    wtk = atomicAdd(&part[c], 1u);
  }
  let ticket = workgroupUniformLoad(&wtk);
  if (ticket + 1u < n) {
    // Not last: store this slice's partial.
    let base = slot * H + hq0;
    for (var i = lid; i < F * D4; i += WG) {
      let w = (base * D4 + i) * 4u;
      let v = wacc[i];
      put_word(w, v.x);
      put_word(w + 1u, v.y);
      put_word(w + 2u, v.z);
      put_word(w + 3u, v.w);
    }
    if (lid < F) {
      let w = (P.ml_off + base + lid) * 4u;
      put_word(w, wfin[lid].x);
      put_word(w + 1u, wfin[lid].y);
    }
    return;
  }
  // Last: merge the other slices' partials into this one's.
  if (lid == 0u) {
    atomicStore(&part[c], 0u);
  }
  let first = tab[rt + 1u];
  for (var i = lid; i < F * D4; i += WG) {
    let f = i / D4;
    let h = hq0 + f;
    var m = 0.0;
    var l = 0.0;
    var o = vec4<f32>(0.0);
    for (var t = 0u; t < SPIN; t++) {
      m = wfin[f].x;
      l = wfin[f].y;
      o = wacc[i];
      var seen = true;
      for (var s = first; s < first + n; s++) {
        if (s == slot) {
          continue;
        }
        let mw = (P.ml_off + s * H + h) * 4u;
        let aw = ((s * H + hq0) * D4 + i) * 4u;
        let wm = take_word(mw);
        let wl = take_word(mw + 1u);
        let wa = vec4<u32>(take_word(aw), take_word(aw + 1u), take_word(aw + 2u), take_word(aw + 3u));
        seen = seen && wm != 0u && wl != 0u && all(wa != vec4<u32>(0u));
        let ms = bitcast<f32>(wm ^ XM);
        let m2 = max(m, ms);
        let a = exp(m - m2);
        let b = exp(ms - m2);
        l = l * a + bitcast<f32>(wl ^ XM) * b;
        o = o * a + bitcast<vec4<f32>>(wa ^ vec4<u32>(XM)) * b;
        m = m2;
      }
      if (seen) {
        break;
      }
    }
    // This lane alone reads the accumulator words of (s, h, column i): reset them now.
    for (var s = first; s < first + n; s++) {
      if (s != slot) {
        let aw = ((s * H + hq0) * D4 + i) * 4u;
        atomicStore(&part[aw], 0u);
        atomicStore(&part[aw + 1u], 0u);
        atomicStore(&part[aw + 2u], 0u);
        atomicStore(&part[aw + 3u], 0u);
      }
    }
    finish(tok, h, i % D4, m, l, o);
  }
  // The (m, l) words once every lane of their head has read them.
  workgroupBarrier();
  for (var j = lid; j < n * F; j += WG) {
    let s = first + j / F;
    if (s != slot) {
      let mw = (P.ml_off + s * H + hq0 + j % F) * 4u;
      atomicStore(&part[mw], 0u);
      atomicStore(&part[mw + 1u], 0u);
    }
  }
}
