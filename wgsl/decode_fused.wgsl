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
//    the device hanging. SPIN is sized for software adapters, where the writer is a CPU thread
//    the OS may deschedule for a time slice (~10 ms) after its ticket: 4096 passes (~0.4 ms on
//    lavapipe) ran out under load and showed NaN (tests, 2-core VM, v0.7).
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
const SPIN: u32 = 262144u;
var<workgroup> wtk: u32;

fn put_word(w: u32, x: f32) {
  atomicStore(&part[w], bitcast<u32>(x) ^ XM);
}

// Slice s's partial of query head h (accumulator columns 4i .. 4i + 3 of its flat head), or the
// neutral (NEG, 0, 0) when not `valid` (past the row, or this workgroup's own slice: slot 0's
// words are read then, and ignored); `seen`: every word read was written in this dispatch.
struct Part {
  m: f32,
  l: f32,
  acc: vec4<f32>,
  seen: bool,
}

fn take_part(s: u32, valid: bool, h: u32, a4: u32) -> Part {
  let t = select(0u, s, valid);
  let mw = (P.ml_off + t * P.num_heads + h) * 4u;
  let aw = ((t * P.num_heads) * D4 + a4) * 4u;
  let wm = atomicLoad(&part[mw]);
  let wl = atomicLoad(&part[mw + 1u]);
  let wa = vec4<u32>(
    atomicLoad(&part[aw]),
    atomicLoad(&part[aw + 1u]),
    atomicLoad(&part[aw + 2u]),
    atomicLoad(&part[aw + 3u]),
  );
  let seen = !valid || (wm != 0u && wl != 0u && all(wa != vec4<u32>(0u)));
  return Part(
    select(NEG, bitcast<f32>(wm ^ XM), valid),
    select(0.0, bitcast<f32>(wl ^ XM), valid),
    select(vec4<f32>(0.0), bitcast<vec4<f32>>(wa ^ vec4<u32>(XM)), valid),
    seen,
  );
}

// The running (m, l, acc) of a merge after partial p.
struct Run {
  m: f32,
  l: f32,
  acc: vec4<f32>,
}

fn merge(r: Run, p: Part) -> Run {
  let m2 = max(r.m, p.m);
  let a = exp(r.m - m2);
  let b = exp(p.m - m2);
  return Run(m2, r.l * a + p.l * b, r.acc * a + p.acc * b);
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
    for (var i = lid; i < FW * D4; i += WG) {
      let w = (base * D4 + i) * 4u;
      let v = wacc[i];
      put_word(w, v.x);
      put_word(w + 1u, v.y);
      put_word(w + 2u, v.z);
      put_word(w + 3u, v.w);
    }
    for (var f = lid; f < FW; f += WG) {
      let w = (P.ml_off + base + f) * 4u;
      put_word(w, wfin[f].x);
      put_word(w + 1u, wfin[f].y);
    }
    return;
  }
  // Last: merge the other slices' partials into this one's.
  if (lid == 0u) {
    atomicStore(&part[c], 0u);
  }
  let first = tab[rt + 1u];
  for (var i = lid; i < FW * D4; i += WG) {
    let f = i / D4;
    let h = hq0 + f;
    let a4 = hq0 * D4 + i; // this lane's accumulator vec4 in slot 0 (slot s: + s * H * D4)
    var r = Run(wfin[f].x, wfin[f].y, wacc[i]);
    for (var t = 0u; t < SPIN; t++) {
      r = Run(wfin[f].x, wfin[f].y, wacc[i]);
      var seen = true;
      // Four slices at a time: their 24 loads are issued before any of them is used.
      for (var s = first; s < first + n; s += 4u) {
        let p0 = take_part(s, s != slot, h, a4);
        let p1 = take_part(s + 1u, s + 1u < first + n && s + 1u != slot, h, a4);
        let p2 = take_part(s + 2u, s + 2u < first + n && s + 2u != slot, h, a4);
        let p3 = take_part(s + 3u, s + 3u < first + n && s + 3u != slot, h, a4);
        seen = seen && p0.seen && p1.seen && p2.seen && p3.seen;
        r = merge(merge(merge(merge(r, p0), p1), p2), p3);
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
    finish(tok, h, i % D4, r.m, r.l, r.acc);
  }
  // The (m, l) words once every lane of their head has read them.
  workgroupBarrier();
  for (var j = lid; j < n * FW; j += WG) {
    let s = first + j / FW;
    if (s != slot) {
      let mw = (P.ml_off + s * H + hq0 + j % FW) * 4u;
      atomicStore(&part[mw], 0u);
      atomicStore(&part[mw + 1u], 0u);
    }
  }
}
