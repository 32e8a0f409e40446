/**
 * WGSL generator for the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`): the
 * straight-line matrix code unrolled for one variant (Q fragments, S = Q K^T, O += P V, with K
 * and V from the staged tiles or, `direct`, from the f16 cache; the O passes through workgroup
 * memory for rescaling and output), and the whole source with every placeholder filled
 * ({@link flashMmaSource}), a bench ablation leaving its stage out. Shapes live in
 * gpu/flash_mma_shape.ts, the layout in gpu/flash_mma_layout.ts, the softmax in
 * gpu/flash_mma_softmax.ts, K/V staging and decoders in gpu/flash_mma_staging.ts.
 * Re-exported from their own modules: the matrix code (gpu/flash_mma_matrix.ts
 * {@link generateMatrixCode}, its O passes in gpu/flash_mma_opass.ts) and the epilogue's writer
 * (gpu/flash_mma_write_rows.ts {@link writeRowsCode}).
 * @module
 */
import { ablatedStages, type MmaConsts, mmaLayout, mmaShapeProblem } from "./flash_mma_shape.ts";
import { fastSoftmaxCode, softmaxCode } from "./flash_mma_softmax.ts";
import {
  roundCode,
  sourceCode,
  type StagingCode,
  stagingCode,
  stagingDecoders,
} from "./flash_mma_staging.ts";
import { valueCleanCode, valueSpecialFns, valueSpecialsCode } from "./flash_mma_specials.ts";
import { mmaLoopCode, type MmaLoopParts } from "./flash_mma_loop.ts";
import { loadWgsl, specialize, TANH_REL_FN } from "./wgsl.ts";
import { envVar } from "../core/env.ts";
import { generateMatrixCode, TAIL_STAGE } from "./flash_mma_matrix.ts";
import { writeRowsCode } from "./flash_mma_write_rows.ts";

export { generateMatrixCode } from "./flash_mma_matrix.ts";
export { writeRowsCode } from "./flash_mma_write_rows.ts";

/**
 * The lazy rescale's protocol around O_RESCALE: by default the workgroup's atomic flag
 * (cleared at the top of a tile, read by workgroupUniformLoad before PV); `sgresc`: the lanes'
 * flags (`resc_lane`, set by the softmax) and the subgroup's own decision after a plain barrier.
 */
function rescaleProtocol(
  c: MmaConsts,
  rescale: string,
): { RESC_RESET: string; RESC_APPLY: string } {
  if (!c.sgresc) {
    return {
      RESC_RESET: "    if (t == 0u) {\n      atomicStore(&s_u[2], 0u);\n    }",
      RESC_APPLY:
        `    let resc = workgroupUniformLoad(&s_u[2]);\n    if (resc != 0u) {\n${rescale}\n    }`,
    };
  }
  return {
    RESC_RESET: "    var resc_lane = false; // this lane's rows need an O rescale this tile",
    RESC_APPLY: [
      "    workgroupBarrier(); // P (and the softmax's reads of S) before PV",
      "    if (subgroupAny(resc_lane)) {",
      rescale,
      "    }",
    ].join("\n"),
  };
}

const LIVE = "live_rows && tile_live(kt, p_lo, p_hi)";

/** The `count` ablation's default trip count: the `1x4224n-h4k1` bench case's tiles. */
const ABLATED_TILES = 264;

/** The `count` ablation's trip count (bench only): ATTN_MMA_ABLATE_TILES, else the default. */
function ablatedTiles(): number {
  const v = Number(envVar("ATTN_MMA_ABLATE_TILES") ?? ABLATED_TILES);
  return Number.isInteger(v) && v > 0 ? v : ABLATED_TILES;
}

/** The kernel source after the generated header (gpu/kernel.ts adds enables and bindings). */
export async function flashMmaSource(c: MmaConsts): Promise<string> {
  const problem = mmaShapeProblem(c, c);
  if (problem) throw new Error(`flash_mma: ${problem}`);
  const lay = mmaLayout(c, c);
  const matrix = generateMatrixCode(c), staging = stagingCode(c);
  const cuts = ablatedStages(c);
  const cut = (stage: string) => cuts.has(stage);
  const loop = loopParts(c, matrix, staging, cut);
  return specialize(await loadWgsl("flash_mma.wgsl"), {
    TANH_REL: TANH_REL_FN,
    HELPERS: await loadWgsl("flash_mma_rows.wgsl"),
    WRITE_ROWS: writeRowsCode({ ovec: c.ovec, sink: cut("write") }),
    TILE: await loadWgsl("flash_tile.wgsl"),
    MM: c.m,
    MN: c.n,
    MK: c.k,
    SG: c.sg,
    NSG: c.nsg,
    RM: c.rm,
    BK: c.bk,
    D: c.d,
    BS: c.bs,
    NHD: c.nhd,
    TAU: c.tau,
    LG: c.fast ? Math.LOG2E : 1,
    M0: c.fast ? "-1.0e30" : "MASK",
    QSPLIT: c.qsplit * c.dsplit, // S arrays: a chain's, or a D half's
    R_DIV: c.dsplit > 1 ? ` / ${c.dsplit}u` : "",
    SG_ROWS: c.dsplit > 1
      ? [
        `  let sgr = (sg / ${c.dsplit}u) * MR; // dsplit subgroups a row block`,
        `  let dh = sg % ${c.dsplit}u; // which part of D`,
        `  let dq = dh * (D / ${c.dsplit}u);`,
      ].join("\n")
      : "  let sgr = sg * MR;",
    LSE_OWNER: c.dsplit > 1 ? " && dh == 0u" : "",
    VT_DECL: c.direct ? "" : `var<workgroup> vt_s: array<f16, ${lay.vtBufs}u * VT_LEN>;`,
    KT_DECL: c.stagger ? `${lay.ktDecl}u` : "2u * KT_LEN",
    E16: lay.e16,
    KT_LEN: lay.ktLen,
    KSTR: lay.kstr,
    SSTR: lay.sstr,
    OSTR: lay.ostr,
    OC: c.ocols,
    S_LEN: lay.sLen,
    PSTR: lay.pstr,
    QPASS: lay.qpass,
    LPR: lay.lpr,
    RPL: lay.rpl,
    DECODE: stagingDecoders(c.kv, c.dtype),
    SOURCE: sourceCode(c),
    ROUND: await roundCode(c.dtype, cut("round") ? "cut" : c.opack ? "pack" : "exact"),
    ...matrix,
    LOOP: mmaLoopCode(c, loop),
    STAGE_LOAD: staging.STAGE_LOAD,
    STAGE_STORE: staging.STAGE_STORE,
    // The epilogue's cut keeps O's stores (no barriers, no output writes): without a reader of O
    // the compiler drops PV with it (v0.9's `~norescale+epilogue` and `~nobare` timed no PV).
    O_OUTPUT: cut("epilogue") ? matrix.O_SINK : matrix.O_OUTPUT,
    V_SPECIAL_FNS: valueSpecialFns(c),
    V_SPECIALS: cut("epilogue") || cut("write") || cut("specials") ? "" : valueSpecialsCode(c),
    QFRAG_DECL: cut("qpass") ? matrix.QFRAG_LET : matrix.QFRAG_DECL,
    QFRAG_LOAD: cut("qpass") ? "" : matrix.QFRAG_LOAD,
  });
}

/** The key loop's pieces (gpu/flash_mma_loop.ts), less what the ablation `cut`s. */
function loopParts(
  c: MmaConsts,
  matrix: Record<string, string>,
  staging: StagingCode,
  cut: (stage: string) => boolean,
): MmaLoopParts {
  const loop: MmaLoopParts = {
    TAIL_STAGE: c.direct && !cut("pv") ? TAIL_STAGE : "",
    LIVE: cut("live") ? "true" : LIVE,
    ...(cut("rescale") ? { RESC_RESET: "", RESC_APPLY: "" } : rescaleProtocol(c, matrix.O_RESCALE)),
    O_RESCALE: cut("rescale") ? "" : matrix.O_RESCALE,
    O_RESCALE_MINE: matrix.O_RESCALE_MINE,
    STAGE_STORE: cut("stage") ? "" : staging.STAGE_STORE,
    SOFTMAX: cut("softmax") ? "" : c.fast ? fastSoftmaxCode(c) : softmaxCode(c),
    LOOP_STAGE_LOAD: cut("stage") ? "" : staging.STAGE_LOAD,
    LOOP_HEAD: cut("count")
      ? `for (var it = 0u; it < ${ablatedTiles()}u; it++) {\n    let kt = kstart + it * BK;`
      : "for (var kt = kstart; kt < kend; kt += BK) {",
    V_CLEAN: cut("specials") ? "" : valueCleanCode(c),
    QK: cut("qk") ? "" : matrix.QK,
    PV: cut("pv") ? "" : matrix.PV,
  };
  return loop;
}
