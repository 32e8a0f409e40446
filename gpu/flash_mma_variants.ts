/**
 * The tensor-core prefill kernel's named shapes (gpu/flash_mma_shape.ts `MmaShape`): what
 * bench/mma_bench.ts sweeps, ATTN_PREFILL_MMA_SHAPE may name for the backend, and the tests
 * force. The backend's own order of preference is gpu/flash_mma_shape.ts `MMA_SHAPES`.
 * @module
 */
import type { MmaShape } from "./flash_mma_shape.ts";

/** 8 subgroups of one row block, 16-key tiles, tau 8, the fast softmax: the defaults' base. */
const W8F = { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true } as const;

/**
 * Named shapes (`w{nsg}r{rm}k{bk}`; `-fa2` tau 0, `-f` fast softmax, `-d` direct K/V loads,
 * `-x` K/V staged by matrix moves, `-s{n}` n chains of S = Q K^T, `-u` the lazy rescale decided
 * per subgroup: `sgresc`, `-l` next-tile stores after PV: `late`, `-d` D split over a pair of
 * subgroups: `dsplit` 2, `-p` the epilogue's O passes in two regions: `oregions` 2, `-w` 32
 * columns a pass: `ocols` 32, `-v` 16-byte output stores: `ovec`, `-r` f16 output rounded by
 * pack2x16float: `opack`, `-i` the key loop pipelined: `pipe`, `-g` its subgroups staggered in two
 * halves: `stagger`),
 * what bench/mma_bench.ts sweeps and ATTN_PREFILL_MMA_SHAPE may name for the backend.
 */
export const MMA_VARIANTS: Readonly<Record<string, MmaShape>> = {
  "w8r1k16": { nsg: 8, rm: 1, bk: 16, tau: 8 },
  "w4r1k16": { nsg: 4, rm: 1, bk: 16, tau: 8 },
  "w4r1k16-fl": { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, late: true },
  "w2r1k16-fl": { nsg: 2, rm: 1, bk: 16, tau: 8, fast: true, late: true },
  "w4r1k32-fl": { nsg: 4, rm: 1, bk: 32, tau: 8, fast: true, late: true },
  "w8r1k16-fa2": { nsg: 8, rm: 1, bk: 16, tau: 0 },
  "w4r1k32": { nsg: 4, rm: 1, bk: 32, tau: 8 },
  "w2r1k16": { nsg: 2, rm: 1, bk: 16, tau: 8 },
  "w4r2k16": { nsg: 4, rm: 2, bk: 16, tau: 8 },
  "w8r1k16-f": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true },
  "w8r1k16-d": { nsg: 8, rm: 1, bk: 16, tau: 8, direct: true },
  "w8r1k16-fd": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, direct: true },
  "w8r1k32-fd": { nsg: 8, rm: 1, bk: 32, tau: 8, fast: true, direct: true },
  "w8r2k16-fd": { nsg: 8, rm: 2, bk: 16, tau: 8, fast: true, direct: true },
  "w4r2k32-fd": { nsg: 4, rm: 2, bk: 32, tau: 8, fast: true, direct: true },
  "w8r1k16-x": { nsg: 8, rm: 1, bk: 16, tau: 8, mstage: true },
  "w8r1k16-fx": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, mstage: true },
  "w4r2k16-fx": { nsg: 4, rm: 2, bk: 16, tau: 8, fast: true, mstage: true },
  "w4r1k32-fx": { nsg: 4, rm: 1, bk: 32, tau: 8, fast: true, mstage: true },
  "w8r1k16-fxs2": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, mstage: true, qsplit: 2 },
  "w4r2k16-fxs2": { nsg: 4, rm: 2, bk: 16, tau: 8, fast: true, mstage: true, qsplit: 2 },
  "w8r1k16-fs2": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, qsplit: 2 },
  "w8r1k16-u": { nsg: 8, rm: 1, bk: 16, tau: 8, sgresc: true },
  "w8r1k16-fu": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, sgresc: true },
  "w8r1k16-l": { nsg: 8, rm: 1, bk: 16, tau: 8, late: true },
  "w8r1k16-fl": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, late: true },
  "w8r1k16-fxl": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, mstage: true, late: true },
  "w8r1k16-fld": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, late: true, dsplit: 2 },
  "w16r1k16-fld": { nsg: 16, rm: 1, bk: 16, tau: 8, fast: true, late: true, dsplit: 2 },
  "w8r2k16-fld": { nsg: 8, rm: 2, bk: 16, tau: 8, fast: true, late: true, dsplit: 2 },
  "w8r1k16-flp": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, late: true, oregions: 2 },
  "w8r1k16-flw": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, late: true, ocols: 32 },
  "w8r1k16-fup": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, sgresc: true, oregions: 2 },
  "w8r1k16-flv": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, late: true, ovec: true },
  "w8r1k16-flr": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, late: true, opack: true },
  "w8r1k16-flvr": { ...W8F, late: true, ovec: true, opack: true },
  "w8r1k16-fvri": { ...W8F, ovec: true, opack: true, pipe: true },
  "w8r1k16-fpvri": { ...W8F, oregions: 2, ovec: true, opack: true, pipe: true },
  "w8r1k16-fvrg": { ...W8F, ovec: true, opack: true, stagger: true },
  "w8r1k16-fri": { nsg: 8, rm: 1, bk: 16, tau: 8, fast: true, opack: true, pipe: true },
  "w4r1k16-fri": { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, opack: true, pipe: true },
  "w8r1k16-i": { nsg: 8, rm: 1, bk: 16, tau: 8, pipe: true },
  "w8r1k16-flpv": { ...W8F, late: true, oregions: 2, ovec: true },
};
