/**
 * Why a shape of the subgroup-matrix prefill kernel (gpu/flash_mma_shape.ts `MmaShape`) cannot
 * be compiled for a target ({@link mmaShapeProblem}): the dims that must divide, the loop forms
 * and options that exclude each other, and the workgroup memory it needs.
 * @module
 */
import { ablatedStages } from "./flash_mma_ablation.ts";
import { mmaLayout } from "./flash_mma_layout.ts";
import type { MmaShape, MmaTarget } from "./flash_mma_shape.ts";

/** Why `shape` cannot be compiled for `t` (within `maxShared` bytes), or null. */
export function mmaShapeProblem(
  t: MmaTarget,
  shape: MmaShape,
  maxShared = Infinity,
): string | null {
  const { m, n, k, d, sg } = t;
  const mr = m * shape.rm;
  if (d % n || d % k || d % 16) return `head_size ${d} is not a multiple of ${Math.max(n, k, 16)}`;
  if (shape.bk % n || shape.bk % k) return `bk ${shape.bk} is not a multiple of ${n} and ${k}`;
  if (sg % mr && mr % sg) return `subgroup size ${sg} and ${mr} rows per subgroup do not nest`;
  if (shape.bk / Math.max(1, sg / mr) < 2) return `bk ${shape.bk} leaves a lane under 2 keys`;
  if (!(shape.tau >= 0 && shape.tau <= 11)) return `tau ${shape.tau} is outside 0..11`;
  if (shape.direct) {
    if (t.kv !== "float16" || t.enc) return `direct loads need an f16 cache, not ${t.kv}`;
    if (t.nchunk !== 1) return `direct loads need one cache buffer, not ${t.nchunk}`;
    if (t.bs % n || t.bs % k) {
      return `direct loads need block_size ${t.bs} a multiple of ${n}, ${k}`;
    }
    if (ablatedStages(shape).has("stage")) return "direct loads stage nothing to leave out";
  }
  const qs = shape.qsplit ?? 1;
  if (![1, 2, 4].includes(qs) || (d / k) % qs) {
    return `qsplit ${qs} is not 1, 2 or 4 dividing ${d / k} k-steps`;
  }
  if (shape.mstage) {
    if (shape.direct) return "matrix staging and direct loads exclude each other";
    if (t.kv !== "float16" || t.enc) return `matrix staging needs an f16 cache, not ${t.kv}`;
    if (t.nchunk !== 1) return `matrix staging needs one cache buffer, not ${t.nchunk}`;
    if (t.bs % t.m) return `matrix staging needs block_size ${t.bs} a multiple of ${t.m}`;
  }
  const ds = shape.dsplit ?? 1;
  if (ds !== 1) {
    if (ds !== 2 || shape.nsg % 2) return `dsplit ${ds} is not 1, or 2 with an even nsg`;
    if (shape.direct || shape.mstage || shape.sgresc || (shape.qsplit ?? 1) !== 1) {
      return "dsplit needs staged tiles, the workgroup's rescale flag and one S chain";
    }
    if ((d / 2) % Math.max(n, k, shape.bk)) return `dsplit 2 halves head_size ${d} unevenly`;
  }
  // The epilogue's pass: `oc` columns over `lpr` lanes a row (mmaLayout's LPR).
  const oc = shape.ocols || shape.bk, org = shape.oregions ?? 1, lpr = Math.max(1, sg / mr);
  if (oc !== shape.bk || org !== 1) {
    if ((shape.dsplit ?? 1) !== 1) return "ocols / oregions need dsplit 1";
    if (oc % n || d % oc || oc % lpr) {
      return `ocols ${oc} does not split head_size ${d} into whole matrices and lanes`;
    }
    if (org !== 1 && org !== 2) return `oregions ${org} is not 1 or 2`;
  }
  if (shape.ovec && (oc / lpr) % 8) {
    return `ovec needs 8 output columns a lane (ocols ${oc}, ${lpr} lanes a row)`;
  }
  if (shape.pipe) {
    if (shape.direct || shape.mstage || shape.sgresc || (shape.dsplit ?? 1) !== 1 || shape.late) {
      return "pipe needs staged tiles, the workgroup's rescale flag, dsplit 1 and no late stores";
    }
    if (ablatedStages(shape).has("count")) return "pipe runs one step past the tiles: no count cut";
  }
  if (shape.stagger) {
    const other = shape.direct || shape.mstage || shape.sgresc || shape.late || shape.pipe;
    if (shape.nsg % 2 || other || (shape.dsplit ?? 1) !== 1 || (shape.qsplit ?? 1) !== 1) {
      return "stagger needs an even nsg, staged tiles, one S chain and no other loop form";
    }
    if ((shape.oregions ?? 1) !== 1 || shape.ablate) return "stagger takes no oregions or ablation";
  }
  if (shape.sgresc && ablatedStages(shape).has("rescale")) {
    return `the ${shape.ablate} ablation cuts the per-subgroup rescale's lane flags`;
  }
  const bytes = mmaLayout(t, shape).shared_bytes;
  if (bytes > maxShared) return `needs ${bytes} B of workgroup memory (limit ${maxShared})`;
  return null;
}
