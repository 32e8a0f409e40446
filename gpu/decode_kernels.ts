/**
 * The two kernels of split-KV decoding as kernel entries: {@link DECODE_SPLIT}
 * (wgsl/decode_split.wgsl plus the straight-line code of gpu/decode_codegen.ts) and
 * {@link DECODE_REDUCE} (wgsl/decode_reduce.wgsl). They share one Params block
 * ({@link DECODE_UNIFORMS}), packed once per plan.
 * @module
 */
import type { DType, StorageDType } from "../core/types.ts";
import {
  DECODERS,
  generateDecodeSplit,
  NAN_FREE_DECODERS,
  PAIR_DECODERS,
} from "./decode_codegen.ts";
import type { KernelDef } from "./kernel.ts";
import { kvAccessorFns, kvBindingDecls, loadWgsl, specialize, TANH_REL_FN } from "./wgsl.ts";
import { dataLoads, dataStores } from "./wgsl_data.ts";
import { PROBE_ENTER, PROBE_LEAVE } from "./decode_residency.ts";

/** The Params fields both decode kernels declare. */
export const DECODE_UNIFORMS = [
  ["num_tokens", "u32"],
  ["num_heads", "u32"],
  ["num_kv_heads", "u32"],
  ["group", "u32"],
  ["num_items", "u32"],
  ["head_tiles", "u32"],
  ["max_blocks", "u32"],
  ["block_size", "u32"],
  ["bt_off", "u32"],
  ["slope_off", "u32"],
  ["tok_off", "u32"],
  ["sink_off", "u32"],
  ["ml_off", "u32"],
  ["num_rows", "u32"],
  ["nwg_x", "u32"],
  ["nwg_x_reduce", "u32"],
  ["block_words", "u32"],
  ["blocks_per_chunk", "u32"],
  ["score_scale", "f32"],
  ["soft_cap", "f32"],
  ["v_scale", "f32"],
  ["has_sink", "u32"],
  ["neg_inf", "f32"],
  ["cnt_off", "u32"],
] as const;

/** Compile-time values of a split-kernel variant. */
export interface DecodeSplitConsts {
  [k: string]: string | number | boolean;
  storage: StorageDType;
  dtype: DType;
  d: number;
  bs: number;
  nhd: boolean;
  nchunk: number;
  hg: number;
  kh: number;
  u: number;
  lpk: number;
  wg: number;
  sg: boolean;
  cap: boolean;
  alibi: boolean;
  early_v: boolean;
  prefetch: boolean;
  /** Transposed sums of the partial dots (gpu/decode_codegen.ts transposedSums). */
  scatter: boolean;
  /** The softmax on the scattered sums (gpu/decode_scatter.ts scatterSoftmax). */
  scatter_softmax: boolean;
  /** fp8 words decoded in byte pairs (PAIR_DECODERS); other storage dtypes ignore it. */
  fp8_pairs: boolean;
  /** An fp8 e4m3 cache known to hold no NaN byte: decoders without the NaN fix-up
   * (NAN_FREE_DECODERS); other storage dtypes ignore it. */
  nan_free: boolean;
  /** The scattered paths gather by indexed shuffles (gpu/decode_scatter.ts gatherIndexed). */
  indexed_gather: boolean;
  /** Key dots and value sums as explicit fmas (tuning `fma_dots`). */
  fma: boolean;
  /** Half vec4 columns a lane (backends/decode_shape.ts `half`). */
  half: boolean;
  /** 0: every slice stores a partial; 1: rows of one slice write their output here; 2: and
   * the reduce is fused (wgsl/decode_epilogue.wgsl, decode_fused.wgsl). Needs wg > lpk. */
  epi: number;
  /** Block-table entries staged in workgroup memory (0: none). */
  tb: number;
  /** vec4<u32>s of the K + V tile staged in workgroup memory (`stage_kv`; 0: plain loads). */
  skv: number;
  /** Kv head blocks a workgroup spans, its key groups spread over them (`wg_kv_heads`). */
  wh: number;
  /** Token items a workgroup spans (`wg_tokens`; > 1 needs wh 1, no staged tile, an epilogue
   * and rows of one slice each: wgsl/decode_split.wgsl). */
  wt: number;
  /** The residency probe's counters bound as `res` (tuning `probe_residency`,
   * gpu/decode_residency.ts). */
  probe: boolean;
}

/** Storage buffers the split kernel binds besides the cache's chunks, for epilogue `epi` (and
 * the residency probe's counters). */
export const splitStorageBindings = (epi: number, probe = false): number =>
  (epi > 0 ? 5 : 3) + (probe ? 1 : 0);

/** The split pass, as data. */
export const DECODE_SPLIT: KernelDef<DecodeSplitConsts> = {
  name: "decode_split",
  uniforms: DECODE_UNIFORMS,
  bindings: (c) => [
    { name: "P", kind: "uniform" },
    { name: "q", kind: "read", type: dataLoads("q", c.dtype, 4).type },
    { name: "tab", kind: "read", type: "array<u32>" },
    {
      name: "part",
      kind: "read_write",
      type: c.epi === 2 ? "array<atomic<u32>>" : "array<vec4<f32>>",
    },
    ...(c.epi > 0
      ? [
        { name: "out", kind: "read_write" as const, type: dataStores("out", c.dtype).type },
        { name: "lse", kind: "read_write" as const, type: "array<f32>" },
      ]
      : []),
    ...(c.probe ? [{ name: "res", kind: "read_write" as const, type: "array<atomic<u32>>" }] : []),
    ...kvBindingDecls(c.nchunk, "read", true),
  ],
  enables: (c) => (c.sg ? ["subgroups"] : []),
  async source(c) {
    const epw = c.storage === "float32" ? 1 : c.storage.startsWith("fp8") ? 4 : 2;
    const rw = c.d / epw, rv = rw / 4, nkg = c.wg / c.lpk, F = c.kh * c.hg;
    const FW = F * c.wh * c.wt;
    const fast = c.nan_free && c.storage === "fp8_e4m3" ? NAN_FREE_DECODERS : null;
    const pairs = c.fp8_pairs ? (fast?.pairs ?? PAIR_DECODERS[c.storage]) : undefined;
    if (c.epi > 0 && nkg < 2) throw new Error(`decode_split: epilogue ${c.epi} needs wg > lpk`);
    if (nkg % c.wh !== 0 || (c.wh > 1 && c.skv > 0)) {
      throw new Error(`decode_split: ${c.wh} kv head blocks need NKG a multiple, no staged tile`);
    }
    if (c.wt > 1 && (nkg % c.wt !== 0 || c.wh > 1 || c.skv > 0 || c.epi === 0 || c.tb > 0)) {
      throw new Error(
        `decode_split: ${c.wt} tokens need NKG a multiple, one kv head block, an epilogue, ` +
          "no staged tile or table",
      );
    }
    return specialize(await loadWgsl("decode_split.wgsl"), {
      TANH_REL: TANH_REL_FN,
      D: c.d,
      BS: c.bs,
      RW: rw,
      EPW: epw,
      LPK: c.lpk,
      U: c.u,
      WG: c.wg,
      HG: c.hg,
      KH: c.kh,
      NHD: c.nhd,
      CAP: c.cap,
      ALIBI: c.alibi,
      RED: c.sg ? 1 : c.wg * c.u * F,
      WACC: nkg > 1 ? (FW * c.d) / 4 : 1,
      WFIN: nkg > 1 ? FW : 1,
      WH: c.wh,
      WT: c.wt,
      ITEM_WORD: c.wt > 1 ? "(item * WT + blk) * 8u" : "item * 8u",
      LW: c.half ? "(lane >> 1u) * 4u" : "lane * 4u",
      LEV: c.half ? epw / 2 : epw,
      SGID: c.indexed_gather ? ", @builtin(subgroup_invocation_id) sgid: u32" : "",
      TB: c.tb,
      TBN: Math.max(1, c.tb),
      STAGE: c.skv > 0,
      SKN: Math.max(1, c.skv),
      EPI: c.epi,
      PROBE_ENTER: c.probe ? PROBE_ENTER : "",
      PROBE_LEAVE: c.probe ? PROBE_LEAVE : "",
      EPILOGUE: await epilogueSource(c, nkg),
      QLOAD: dataLoads("q", c.dtype, 4).code,
      WORDS: await loadWgsl("decode_words.wgsl"),
      ...generateDecodeSplit({
        hg: c.hg,
        kh: c.kh,
        u: c.u,
        lpk: c.lpk,
        cpl: (c.half ? 2 * rv : rv) / c.lpk,
        half: c.half,
        epw,
        nkg,
        sg: c.sg,
        alibi: c.alibi,
        early_v: c.early_v,
        prefetch: c.prefetch && c.skv === 0,
        stage: c.skv,
        rv,
        scatter: c.scatter,
        scatter_softmax: c.scatter_softmax,
        indexed: c.indexed_gather,
        fma: c.fma,
        epilogue: c.epi > 0,
        tokens: c.wt > 1,
        dec: pairs ?? fast?.words ?? DECODERS[c.storage],
        swz: pairs !== undefined,
      }),
      KV: kvAccessorFns({
        nchunk: c.nchunk,
        blocksPerChunk: "P.blocks_per_chunk",
        blockWords: "P.block_words",
        vec4: true,
      }),
    });
  },
};

/** The epilogue files of a split kernel and its output store (epi 0: the partial's store when
 * the workgroup has several key groups, else nothing). */
async function epilogueSource(c: DecodeSplitConsts, nkg: number): Promise<string> {
  if (c.epi === 0) return nkg > 1 ? await loadWgsl("decode_partial.wgsl") : "";
  const round = c.dtype === "float32" ? "" : await loadWgsl("round.wgsl");
  const part = await loadWgsl(c.epi === 2 ? "decode_fused.wgsl" : "decode_partial.wgsl");
  return [
    round,
    dataStores("out", c.dtype).code,
    await loadWgsl("decode_finish.wgsl"),
    await loadWgsl("decode_epilogue.wgsl"),
    part,
  ].join("\n");
}

/** The reduce pass, as data. */
export const DECODE_REDUCE: KernelDef<{ d: number; dtype: DType }> = {
  name: "decode_reduce",
  uniforms: DECODE_UNIFORMS,
  bindings: (c) => [
    { name: "P", kind: "uniform" },
    { name: "tab", kind: "read", type: "array<u32>" },
    { name: "part", kind: "read", type: "array<vec4<f32>>" },
    { name: "out", kind: "read_write", type: dataStores("out", c.dtype).type },
    { name: "lse", kind: "read_write", type: "array<f32>" },
  ],
  async source(c) {
    const round = c.dtype === "float32" ? "" : await loadWgsl("round.wgsl");
    return specialize(await loadWgsl("decode_reduce.wgsl"), {
      D: c.d,
      OUT: [round, dataStores("out", c.dtype).code, await loadWgsl("decode_finish.wgsl")].join(
        "\n",
      ),
    });
  },
};
