/**
 * The workgroup-memory layout of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl): the
 * derived compile-time sizes a target and a shape imply ({@link mmaLayout}: tiles, strides,
 * workgroup memory) and the stride argument of the kernel's workgroup matrix calls
 * ({@link strideArg}).
 * @module
 */
import type { StorageDType } from "../core/types.ts";
import { envVar } from "../core/env.ts";
import type { MmaShape, MmaTarget } from "./flash_mma_shape.ts";

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
