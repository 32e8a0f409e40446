/**
 * How long the split pass's slices are ({@link sliceLength}): one length for every row of a
 * call, a multiple of the key-group step. Two policies (backends/webgpu_decode_tuning.ts):
 * - `waves` 0: the total key count over a target workgroup count (`target_workgroups`: 2048 on
 *   GPUs), the original heuristic, whatever the rows look like.
 * - `waves` > 0: from the rows' key counts and the device's wave (`wave_workgroups`, the split
 *   workgroups it runs at once): rows are not cut at all when they alone give `waves` waves of
 *   workgroups (long batches, or short contexts), else the shortest slice whose workgroups stay
 *   within `waves` waves, so the last wave is as full as the lengths allow.
 * @module
 */
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";

/** What the slice length depends on. */
export interface SliceInput {
  /** Keys each row's slices span (from its first key rounded down to the step's key count). */
  spans: number[];
  /** Split workgroups per slice (kv head blocks x head tiles). */
  perItem: number;
  /** Keys per workgroup step; the length is a multiple of it. */
  step: number;
  /** The workgroup target of the `waves` 0 policy. */
  target: number;
}

/** Slices of the rows at length `len` (a row of no keys is one slice). */
export function sliceCount(spans: number[], len: number): number {
  return spans.reduce((n, s) => n + Math.max(1, Math.ceil(s / len)), 0);
}

const roundUp = (x: number, m: number) => Math.max(m, Math.ceil(x / m) * m);

/** The slice length for `x` under `t` (see the module doc). */
export function sliceLength(t: DecodeTuning, x: SliceInput): number {
  const longest = roundUp(Math.max(1, ...x.spans), x.step);
  if (t.waves <= 0) {
    const keys = x.spans.reduce((a, b) => a + b, 0);
    const len = Math.max(t.min_split_keys, Math.ceil(keys / Math.max(1, x.target / x.perItem)));
    return roundUp(len, x.step);
  }
  const want = t.waves * Math.max(1, t.wave_workgroups);
  const least = roundUp(t.min_split_keys, x.step);
  if (x.spans.length * x.perItem >= want || longest <= least) return longest;
  // The shortest length in [least, longest] whose slices fit `want` (count falls with length).
  let lo = least / x.step, hi = longest / x.step;
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    if (sliceCount(x.spans, mid * x.step) * x.perItem <= want) hi = mid;
    else lo = mid + 1;
  }
  return lo * x.step;
}
