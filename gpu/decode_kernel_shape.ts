/**
 * The compile-time shape of one WEBGPU_DECODE split kernel ({@link KernelShape}), what
 * gpu/decode_codegen.ts unrolls, and the index ranges and offsets its fragments unroll over
 * ({@link Unrolled}, {@link unrolled}).
 * @module
 */

/** The compile-time shape of one split kernel. */
export interface KernelShape {
  /** Query heads per kv head in the workgroup, kv heads per key group, keys per step. */
  hg: number;
  kh: number;
  u: number;
  lpk: number;
  /** vec4<u32> columns per lane per row (halves under `half`); value vec4s per vec4 column;
   * key groups per workgroup. */
  cpl: number;
  epw: number;
  nkg: number;
  sg: boolean;
  /** Each lane takes half a vec4 column (words 0-1 or 2-3 by lane parity) of a row: `cpl` counts
   * half columns, the key group spans lpk / 2 vec4 columns at a time, a lane decodes epw / 2
   * value vec4s of each. */
  half: boolean;
  alibi: boolean;
  /** Issue the value rows' loads together with the keys' (before the softmax). */
  early_v: boolean;
  /** Issue the next step's K and V loads before this step's arithmetic (double buffer). */
  prefetch: boolean;
  /** vec4<u32>s of the K + V tile staged in workgroup memory `skv` (0: plain loads; replaces
   * `prefetch`): gpu/decode_stage.ts. */
  stage: number;
  /** vec4<u32>s of one key row. */
  rv: number;
  /** End in wgsl/decode_epilogue.wgsl (needs nkg > 1) instead of storing the partial here. */
  epilogue: boolean;
  /** The workgroup spans several token items (`wg_tokens`, rows of one slice each): its
   * epilogue is told NONE (its key groups' row fields are not uniform; needs `epilogue`). */
  tokens?: boolean;
  /** Sum the U x F partial dots of a step by a transposed reduction (reduce-scatter by
   * recursive halving, then all-gather by recursive doubling: about 2 N shuffles for N values
   * instead of N log2 LPK); subgroups only. */
  scatter: boolean;
  /** The step's softmax on the scattered sums (gpu/decode_scatter.ts scatterSoftmax): each lane
   * takes the exp of its own scores only; subgroups only. */
  scatter_softmax: boolean;
  /** The scattered paths' final all-gather by indexed shuffles (needs `sgb`: SGID). */
  indexed: boolean;
  /** Key dots as fma chains into the score, value sums as vec4 fmas (tuning `fma_dots`). */
  fma?: boolean;
  /** Decoders of a vec4<u32> `w` into EPW vec4<f32>, in element order, or under `swz` in the
   * order (0, 2, 1, 3) of each word ({@link PAIR_DECODERS}). */
  dec: string[];
  /** The decoders' vec4s hold (0, 2, 1, 3): the query is loaded and the accumulators stored
   * through the same swizzle (.xzyw, its own inverse). */
  swz: boolean;
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** The ranges one kernel's straight-line fragments unroll over, and what they share. */
export interface Unrolled {
  /** Flat heads f = kh * hg + h, kv heads, keys u < U, lane columns j < cpl. */
  F: number[];
  KH: number[];
  Us: number[];
  J: number[];
  /** Value vec4s a lane decodes of each (half) column, and their range. */
  ev: number;
  E: number[];
  /** vec4 columns a key group covers at a time. */
  cols: number;
  /** A lane's value vec4s i = j * ev + e of each flat head. */
  NV: number[];
  /** The query's and the accumulators' swizzle (".xzyw" under `swz`, else ""). */
  sw: string;
  /** Offset of value vec4 i of flat head f from the lane's first vec4 of the first head. */
  off: (f: number, i: number) => string;
  /** The step's softmax on the scattered sums (gpu/decode_scatter.ts scatterSoftmax). */
  scatterSm: boolean;
}

/** The ranges and offsets of {@link KernelShape} `k`'s fragments. */
export function unrolled(k: KernelShape): Unrolled {
  const F = range(k.kh * k.hg),
    KH = range(k.kh),
    Us = range(k.u),
    J = range(k.cpl),
    ev = k.half ? k.epw / 2 : k.epw, // value vec4s a lane decodes of each (half) column
    cols = k.half ? k.lpk / 2 : k.lpk, // vec4 columns a key group covers at a time
    E = range(ev);
  const NV = range(k.cpl * ev);
  const sw = k.swz ? ".xzyw" : "";
  const off = (f: number, i: number) =>
    `${f}u * D4 + ${Math.floor(i / ev) * k.lpk * ev + (i % ev)}u`;
  // The scattered paths need subgroups and several lanes a row.
  const scatterSm = k.scatter_softmax && k.sg && k.lpk > 1;
  return { F, KH, Us, J, ev, cols, E, NV, sw, off, scatterSm };
}
