/**
 * The compile-time shape of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl): what a
 * batch and a device fix ({@link MmaTarget}), the kernel shape ({@link MmaShape}), the shapes
 * tried in order ({@link MMA_SHAPES}), and the workgroup-memory layout they imply
 * ({@link mmaLayout}), with the reason a shape cannot be compiled ({@link mmaShapeProblem}).
 * @module
 */
import type { StorageDType } from "../core/types.ts";
import { envVar } from "../core/env.ts";

/** What a bench-only ablation leaves out (results wrong by design; never planned by a backend). */
export type MmaAblation =
  | "softmax"
  | "stage"
  | "qk"
  | "pv"
  | "rescale" // the O rescale, its flag and the uniform load's barriers (timing only)
  | "live" // the causal / window tile-liveness test: every subgroup runs every tile
  | "loop" // rescale and live together: the loop's bookkeeping the v0.7 ladder lacks
  | "count" // the key loop's trip count a compile-time constant (ATTN_MMA_ABLATE_TILES, default
  // 264: the `1x4224n-h4k1` bench case's tiles; other shapes read wrong keys): what the
  // run-time count costs (the ladder's -xd: 16%)
  | "qpass" // Q's fragments loaded once, unconditionally, as `let`s (wrong data): what the
  // passes' conditional assignments to the fragment `var`s cost in the loop
  | "epilogue" // the O passes' barriers and output writes after the loop (the fixed
  // per-workgroup cost); O is still stored to workgroup memory, so PV stays live
  | "round" // the output's rounding: round_pair keeps the top halves of the f32 bits
  | "write" // the output's stores: the epilogue's words folded into one a lane, not stored
  | "specials" // the non-finite values of tiles not every row sees whole (gpu/
  // flash_mma_specials.ts): staged as they are, no repair (right for finite caches)
  | "bare"; // loop, softmax and epilogue together: QK, staging and PV in the kernel's frame

/**
 * The stages a shape's `ablate` leaves out (`+`-joined names; `loop` and `bare` stand for
 * several); empty for a real shape.
 */
export function ablatedStages(shape: MmaShape): Set<string> {
  const groups: Record<string, string[]> = {
    loop: ["rescale", "live"],
    bare: ["rescale", "live", "softmax", "epilogue"],
  };
  const names = shape.ablate ? shape.ablate.split("+") : [];
  return new Set(names.flatMap((a) => groups[a] ?? [a]));
}

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

/** Derived compile-time sizes of one variant. */
export interface MmaLayout {
  rows: number;
  wg: number;
  /** A K buffer's length (f16), the stride between the loop's buffers. */
  ktLen: number;
  /** kt_s's declared length (f16): two K buffers (with P over them, or after them: stagger). */
  ktDecl: number;
  /** V buffers (f16, ktLen-sized unless direct): 2, or 3 for stagger. */
  vtBufs: number;
  qpass: number;
  lpr: number;
  rpl: number;
  e16: number;
  /**
   * Row strides (elements) of the workgroup tiles: K, V and Q (f16), P (f16), S and O (f32).
   * Compile-time in the kernel's index math and in its matrix calls; also Params words, which
   * the calls take instead under the bench-only `ATTN_MMA_RUNTIME_STRIDES` (see `strideArg`).
   */
  kstr: number;
  pstr: number;
  sstr: number;
  /** f32 row stride of the epilogue's O passes (ocols + 4) and the length of s_s in floats. */
  ostr: number;
  sLen: number;
  /** Workgroup memory in bytes. */
  shared_bytes: number;
}
const BYTES: Record<StorageDType, number> = {
  float32: 4,
  float16: 2,
  bfloat16: 2,
  fp8_e4m3: 1,
  fp8_e5m2: 1,
};

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

export { MMA_VARIANTS } from "./flash_mma_variants.ts";

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

/** Sizes of the kernel's arrays (see wgsl/flash_mma.wgsl). */
export function mmaLayout(t: MmaTarget, shape: MmaShape): MmaLayout {
  const { d, sg } = t, mr = t.m * shape.rm;
  const ds = shape.dsplit ?? 1;
  const rows = mr * shape.nsg / ds, kstr = d + 8, sstr = shape.bk + 4, pstr = shape.bk + 8;
  // Direct loads: kt_s holds the Q passes, P and the last tile's V; there is no V tile.
  const kTile = shape.direct ? 0 : shape.bk * kstr;
  // stagger: K buffers of a tile each, then P (a half's rows: one buffer, then two).
  const ktLen = shape.stagger ? shape.bk * kstr : Math.max(shape.bk * kstr, rows * pstr, mr * kstr);
  const ktDecl = shape.stagger ? Math.max(2 * ktLen + 3 * (rows / 2) * pstr, mr * kstr) : 2 * ktLen;
  const vtBufs = shape.stagger ? 3 : 2;
  // Q rows staged a pass: in one K buffer (stagger: in all of kt_s).
  const qpass = Math.min(rows, Math.floor((shape.stagger ? ktDecl : ktLen) / kstr / mr) * mr);
  const e16 = 16 / BYTES[t.kv];
  // One S array a chain (a D half's for dsplit); the epilogue's O pass regions.
  const ostr = (shape.ocols || shape.bk) + 4;
  // stagger: S, then the second half's rows of the O rescale (its S rows are in use then).
  const sLen = Math.max(
    rows * sstr * (shape.qsplit ?? 1) * ds * (shape.stagger ? 1.5 : 1),
    rows * ostr * (shape.oregions ?? 1) * ds,
  );
  const shared_bytes = 2 * (ktDecl + vtBufs * kTile) + 4 * sLen + 12;
  return {
    rows,
    wg: sg * shape.nsg,
    ktLen,
    ktDecl,
    vtBufs,
    qpass,
    lpr: Math.max(1, sg / mr),
    rpl: Math.max(1, mr / sg),
    e16,
    kstr,
    pstr,
    sstr,
    ostr,
    sLen,
    shared_bytes,
  };
}

/** Kinds of workgroup matrix call, for the bench-only run-time stride probe. */
const STRIDE_KINDS = ["q", "k", "v", "p", "s", "o", "m"] as const;

/**
 * The stride argument of one kind of workgroup matrix call: the WGSL constant (`KSTR`, `PSTR`,
 * `SSTR`). Constant strides read wrong tiles on the H200 while the kernel declared three scalar
 * workgroup variables beside its tiles (bench/NOTES.md v0.12-v0.13); with them packed into one
 * 16-byte array they are right in every variant and test there, and 8 x 4096 runs at 99.2
 * TFLOP/s against 81.0 with the Params words (v0.16). The kinds named in the bench-only
 * `ATTN_MMA_RUNTIME_STRIDES` (comma list of q, k, v, p, s, o, m (mstage stores), or `all`) take
 * the Params word `U.<word>` instead, for an A/B. Read when a kernel's source is generated: a
 * pipeline already cached keeps the strides it was built with.
 */
export function strideArg(
  kind: (typeof STRIDE_KINDS)[number],
  word: "kstr" | "pstr" | "sstr",
): string {
  const set = (envVar("ATTN_MMA_RUNTIME_STRIDES") ?? "").split(",");
  return set.includes(kind) || set.includes("all") ? `U.${word}` : word.toUpperCase();
}
