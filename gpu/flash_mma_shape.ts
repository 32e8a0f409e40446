/**
 * The compile-time shape of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl): what a
 * batch and a device fix ({@link MmaTarget}), the kernel shape ({@link MmaShape}), the shapes
 * tried in order ({@link MMA_SHAPES}) and the first that compiles ({@link chooseMmaShape}).
 * Re-exported from their own modules: the workgroup-memory layout they imply
 * (gpu/flash_mma_layout.ts {@link mmaLayout}, {@link strideArg}), the reason a shape cannot be
 * compiled (gpu/flash_mma_shape_problem.ts {@link mmaShapeProblem}), the bench-only ablations
 * (gpu/flash_mma_ablation.ts) and the named shapes (gpu/flash_mma_variants.ts).
 * @module
 */
import type { StorageDType } from "../core/types.ts";
import type { MmaAblation } from "./flash_mma_ablation.ts";
import { mmaShapeProblem } from "./flash_mma_shape_problem.ts";

export { ablatedStages, type MmaAblation } from "./flash_mma_ablation.ts";
export { type MmaLayout, mmaLayout, strideArg } from "./flash_mma_layout.ts";
export { mmaShapeProblem } from "./flash_mma_shape_problem.ts";
export { MMA_VARIANTS } from "./flash_mma_variants.ts";

/** A kernel shape. Rows per workgroup = nsg * rm * m. */
export interface MmaShape {
  /** Subgroups per workgroup. */
  nsg: number;
  /** Row blocks (of m rows) per subgroup. */
  rm: number;
  /** Keys per K/V tile. */
  bk: number;
  /** Lazy-rescale threshold (natural log units, 0..11); 0 rescales on every new max. */
  tau: number;
  /**
   * The softmax specialized at compile time (only the batch's features: no soft cap, ALiBi,
   * window or sink code when off), without per-key masks on interior tiles (every key visible
   * to every row of the subgroup), on exp2 with log2(e) folded into the scale. Default false.
   */
  fast?: boolean;
  /**
   * K and V fragments loaded by `subgroupMatrixLoad` straight from an f16 cache (no staging, no
   * K/V tiles): one cache buffer, block size a multiple of the matrix dims. Keys past the
   * visible range get masked scores and p = 0; the V rows past the request's end (anything,
   * NaN included) come from a zero-padded copy of its last tile. Default false.
   */
  direct?: boolean;
  /**
   * K/V tiles staged by matrix moves: each subgroup `subgroupMatrixLoad`s fragments of the
   * tile from an f16 cache (one buffer, block size a multiple of the matrix rows: a fragment's
   * rows lie in one block)
   * and `subgroupMatrixStore`s them into the workgroup tiles, instead of 16-byte loads and f16
   * stores by every lane; the request's last, partial tile is copied element by element,
   * zero past the visible keys. Default false.
   */
  mstage?: boolean;
  /**
   * Independent accumulator chains of S = Q K^T per key block (1, 2 or 4): chain j sums head
   * dims k-steps j, j + qsplit, ..., each is stored to its own S array, the softmax adds them;
   * D / MK dependent multiply-accumulates become D / MK / qsplit. Default 1.
   */
  qsplit?: number;
  /**
   * The lazy rescale decided per subgroup: the lanes' flags reduced by subgroupAny after a
   * plain P barrier, the O round trip through the subgroup's own rows of s_s with no workgroup
   * barrier inside, instead of the workgroup's atomic flag read by workgroupUniformLoad (a
   * barrier more a tile, two atomics). Relies on the device ordering a subgroup's own
   * workgroup-memory hand-offs, as the v0.7 ladder's `-nb` did on the H200. Default false.
   */
  sgresc?: boolean;
  /**
   * The loop's workgroup-memory stores of the next tiles moved late: the next tile's K/V words
   * and the block ids two tiles ahead are loaded at the top of a tile as before but stored just
   * before its closing barrier (after PV, not before it), so their global loads have the whole
   * tile to land instead of stalling subgroup 0 (the block ids) or every lane (the words)
   * before PV. Default false.
   */
  late?: boolean;
  /**
   * Subgroups per 16-row block (1 or 2): with 2, a pair of subgroups shares each block of rows,
   * each holding half of D in its Q fragments and O accumulators (half the registers a lane:
   * more workgroups resident), S as two partial products (chains, added by the softmax, which
   * both run; the first writes P). Rows per workgroup halve. Default 1.
   */
  dsplit?: number;
  /**
   * The epilogue's O passes through s_s (normalise and write): `ocols` columns a pass (default
   * `bk`, the S tile's width; 0 means that too) in `oregions` regions used in turn (default 1).
   * With 2 regions a pass's stores go where the pass before last was read, which the last pass's
   * barrier already ordered, so the barrier after each pass's writes goes: D / ocols barriers
   * instead of 2 D / ocols - 1. Both grow s_s (ocols + 4 floats a row, times the regions). The
   * in-loop O rescale keeps `bk`-column passes in region 0. Needs dsplit 1.
   */
  ocols?: number;
  oregions?: number;
  /**
   * The epilogue's lanes write their 8 output elements of a row in one 16-byte store (`out` as
   * `array<vec4<u32>>`) instead of four 4-byte ones. Needs 8 columns a lane in a pass.
   */
  ovec?: boolean;
  /**
   * The epilogue rounds f16 output pairs with `pack2x16float` where both are inside f16's finite
   * range, with round.wgsl's integer rounding otherwise (gpu/flash_mma_staging.ts roundCode).
   * Byte-identical where the device's f32 -> f16 conversion rounds to nearest even. bf16 output
   * is unchanged. Default false.
   */
  opack?: boolean;
  /**
   * The key loop pipelined (gpu/flash_mma_loop.ts): a tile's O += P V runs in the next step,
   * between the same barriers as that step's S = Q K^T, and the next tile's stores follow the
   * softmax: three barriers a tile instead of four, and independent matrix work side by side.
   * Staged tiles only (not `direct` or `mstage`), the workgroup's rescale flag (not `sgresc`),
   * dsplit 1; `late` does not apply. Default false (the default shapes set it: v0.33).
   */
  pipe?: boolean;
  /**
   * The pipelined loop with the workgroup's subgroups in two halves half a step apart
   * (gpu/flash_mma_loop.ts): while one half runs its matrix work the other runs its softmax, so
   * the tensor cores and the lanes' arithmetic overlap between the same barriers (as
   * FlashAttention-3's ping-pong of warpgroups). P has its own buffers (one for the first half,
   * two for the second), V three; the rescale flags are bits of one word. An even nsg, staged
   * tiles, one S chain, one epilogue region, no other loop form or ablation. Default false (a
   * bench shape: 6% slower than `pipe` on an H100, bench/NOTES.md v0.33).
   */
  stagger?: boolean;
  /** Bench only: leave stages out to time the rest (see {@link MmaAblation}); "": none. */
  ablate?:
    | MmaAblation
    | `${MmaAblation}+${MmaAblation}`
    | `${MmaAblation}+${MmaAblation}+${MmaAblation}`
    | "";
}

/** A shape with every optional field filled in (the pipeline key names them all). */
export type FullMmaShape = Required<MmaShape>;

/** `s` with the defaults of its optional fields. */
export function fullShape(s: MmaShape): FullMmaShape {
  return {
    nsg: s.nsg,
    rm: s.rm,
    bk: s.bk,
    tau: s.tau,
    fast: s.fast ?? false,
    direct: s.direct ?? false,
    mstage: s.mstage ?? false,
    qsplit: s.qsplit ?? 1,
    sgresc: s.sgresc ?? false,
    late: s.late ?? false,
    dsplit: s.dsplit ?? 1,
    ocols: s.ocols || s.bk,
    oregions: s.oregions ?? 1,
    ovec: s.ovec ?? false,
    opack: s.opack ?? false,
    pipe: s.pipe ?? false,
    stagger: s.stagger ?? false,
    ablate: s.ablate ?? "",
  };
}

/** What the batch and the device fix: data and K/V dtypes, layout, matrix dims, subgroup size. */
export interface MmaTarget {
  /** K/V element type: the cache's storage dtype, or the data dtype for encoder types. */
  kv: StorageDType;
  /** Query / output dtype. */
  dtype: "float16" | "bfloat16";
  /** K/V from the call (encoder types) instead of the cache. */
  enc: boolean;
  d: number;
  bs: number;
  nhd: boolean;
  /** Buffers per cache tensor (0 for encoder types). */
  nchunk: number;
  /** f16 x f16 -> f32 subgroup-matrix dims (M x K times K x N). */
  m: number;
  n: number;
  k: number;
  /** The device's subgroup size. */
  sg: number;
  /** The batch's attention features (compiled in by `fast` shapes). */
  causal: boolean;
  window: boolean;
  softcap: boolean;
  alibi: boolean;
  sinks: boolean;
}

/** Every compile-time value of one variant (the pipeline key names them all). */
export interface MmaConsts extends MmaTarget, FullMmaShape {
  [k: string]: string | number | boolean;
}

/**
 * Shapes in order of preference: the first that fits the device is the default. All with the
 * fast softmax (v0.8: +21% on the H200 at 8 x 4096, opt-in until its tests could finish there:
 * the v0.7 Dawn stalls) and the output rounded by pack2x16float. The first two run the pipelined
 * key loop (`pipe`, v0.33: a tile's PV beside the next tile's QK, three barriers a tile; on the
 * H100 +0.5-0.6% at 4 x 1024 f16, +2.6% over a bf16 cache, +1.4% at 8 x 4096 over the same shapes
 * with `late`), the first also stores 16 bytes of output at once (`w8r1k16-fvri`; v0.19: +8% at
 * 4 x 1024 and +4% at 8 x 4096 on the H100); `w8r1k16-fri`, the same without the 16-byte stores,
 * follows it for devices where a lane's pass has fewer than 8 columns (64-lane subgroups). The
 * smaller shapes keep the late next-tile stores (not measured pipelined).
 */
export const MMA_SHAPES: readonly MmaShape[] = [
  { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, pipe: true, ovec: true, opack: true },
  { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, pipe: true, opack: true },
  { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, late: true, opack: true },
  { nsg: 4, rm: 1, bk: 32, tau: 8, fast: true, late: true, opack: true },
  { nsg: 2, rm: 1, bk: 16, tau: 8, fast: true, late: true, opack: true },
  { nsg: 2, rm: 1, bk: 8, tau: 8, fast: true, late: true, opack: true },
  { nsg: 1, rm: 1, bk: 8, tau: 8, fast: true, late: true, opack: true },
];

/** The first of {@link MMA_SHAPES} that compiles for `t` within `maxShared` bytes. */
export function chooseMmaShape(t: MmaTarget, maxShared: number): MmaShape | null {
  return MMA_SHAPES.find((s) => mmaShapeProblem(t, s, maxShared) === null) ?? null;
}
