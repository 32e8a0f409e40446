/**
 * What the unrolled matrix code of the subgroup-matrix prefill kernel shares for one kernel
 * ({@link MatrixFrame}, {@link matrixFrame}): the fragment ranges, the fragment types, the
 * dsplit offsets and the staged tiles' row stride (gpu/flash_mma_matrix.ts,
 * gpu/flash_mma_opass.ts).
 * @module
 */
import type { MmaConsts } from "./flash_mma_shape.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** The ranges, offsets and fragment types the matrix code of one kernel shares. */
export interface MatrixFrame {
  /** The matrix dims (M x K times K x N), the head size, keys per tile, direct K/V loads. */
  m: number;
  n: number;
  k: number;
  d: number;
  bk: number;
  direct: boolean;
  /** The staged tiles' row stride (D + 8) and the subgroups a row block (dsplit). */
  kstr: number;
  ds: number;
  /** dsplit: the offset of this subgroup's D columns ("dq + " or "") and its S / O rows. */
  dqp: string;
  srow: string;
  /** Row blocks, Q k-steps, S key blocks, PV k-steps and O column blocks of a subgroup. */
  RM: number[];
  KD: number[];
  NB: number[];
  KB: number[];
  DN: number[];
  /** The left (Q, P), right (K, V) and result (S, O) fragment types; the multiply-accumulate. */
  L: string;
  Rt: string;
  Res: string;
  mma: string;
}

/** The {@link MatrixFrame} of kernel `c`. */
export function matrixFrame(c: MmaConsts): MatrixFrame {
  const { m, n, k, d, bk, direct } = c, shape = c;
  const kstr = d + 8, ds = c.dsplit;
  // dsplit: this subgroup's half of D (columns dq..) and its own S / O rows of s_s (chain dh).
  const dqp = ds > 1 ? "dq + " : "", srow = ds > 1 ? "sgr + dh * R" : "sgr";
  const RM = range(shape.rm), KD = range(d / k / ds), NB = range(bk / n), KB = range(bk / k);
  const DN = range(d / n / ds);
  const L = `subgroup_matrix_left<f16, MK, MM>`, Rt = `subgroup_matrix_right<f16, MN, MK>`;
  const Res = `subgroup_matrix_result<f32, MN, MM>`;
  const mma = "subgroupMatrixMultiplyAccumulate";
  return { m, n, k, d, bk, direct, kstr, ds, dqp, srow, RM, KD, NB, KB, DN, L, Rt, Res, mma };
}
