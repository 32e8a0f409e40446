/**
 * How long the split pass's slices are ({@link sliceLength}): one length for every row of a
 * call, a multiple of the key-group step. Two policies (backends/webgpu_decode_tuning.ts):
 * - `waves` 0: the total key count over a target workgroup count (`target_workgroups`: 2048 on
 *   GPUs), the original heuristic, whatever the rows look like.
 * - `waves` > 0: from the rows' key counts and the device's wave (`wave_workgroups` as
 *   decode_shape.ts resolves it: the split workgroups it runs at once). A slice of length L
 *   costs its workgroup `slice_overhead + L` key-times (prologue, merge and partials being the
 *   overhead), and W(L) workgroups run in ceil(W / wave) waves, so the call takes about
 *   ceil(W(L) / wave) x (slice_overhead + L): the length minimising that (a workgroup spanning
 *   n kv head blocks, `wg_kv_heads`, costs `slice_overhead + n L`), over the lengths whose
 *   waves stay within `waves` (or within what the rows need uncut, when that is more). Short
 *   contexts and batches whose rows fill the waves are not cut; a wave is filled as far as the
 *   lengths allow.
 * @module
 */
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";

/** What the slice length depends on. */
export interface SliceInput {
  /** Keys each row's slices span (from its first key rounded down to the step's key count). */
  spans: ArrayLike<number>;
  /** Split workgroups per slice (kv head blocks x head tiles). */
  perItem: number;
  /** Keys per workgroup step; the length is a multiple of it. */
  step: number;
  /** The workgroup target of the `waves` 0 policy. */
  target: number;
  /** Split workgroups the device runs at once (decode_shape.ts resolves `wave_workgroups`). */
  wave: number;
  /** Key rows a workgroup streams per key of its slice, relative to one kv head block over all
   * its key groups (`wg_kv_heads`: its blocks share the key groups; default 1). */
  weight?: number;
}

/** Slices of the rows at length `len` (a row of no keys is one slice). */
export function sliceCount(spans: ArrayLike<number>, len: number): number {
  let n = 0;
  for (let i = 0; i < spans.length; i++) n += Math.max(1, Math.ceil(spans[i] / len));
  return n;
}

const roundUp = (x: number, m: number) => Math.max(m, Math.ceil(x / m) * m);

/** The slice length for `x` under `t` (see the module doc). */
export function sliceLength(t: DecodeTuning, x: SliceInput): number {
  let most = 1, keys = 0;
  for (let i = 0; i < x.spans.length; i++) {
    most = Math.max(most, x.spans[i]);
    keys += x.spans[i];
  }
  const longest = roundUp(most, x.step);
  if (t.waves <= 0) {
    const len = Math.max(t.min_split_keys, Math.ceil(keys / Math.max(1, x.target / x.perItem)));
    return roundUp(len, x.step);
  }
  const wave = Math.max(1, x.wave);
  const wavesOf = (len: number) => Math.ceil((sliceCount(x.spans, len) * x.perItem) / wave);
  const cap = Math.max(t.waves, wavesOf(longest));
  const least = roundUp(t.min_split_keys, x.step);
  const k = x.weight ?? 1;
  let best = longest, bestCost = wavesOf(longest) * (t.slice_overhead + k * longest);
  // Every distinct slice count of the longest row, down to the least slice.
  for (let c = 2; c <= Math.ceil(longest / least); c++) {
    const len = roundUp(Math.ceil(longest / c), x.step);
    if (len < least) break;
    const w = wavesOf(len);
    if (w > cap) break;
    const cost = w * (t.slice_overhead + k * len);
    if (cost < bestCost) [best, bestCost] = [len, cost];
  }
  return best;
}
