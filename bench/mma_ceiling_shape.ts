/**
 * The arrangements of the subgroup-matrix ceiling probe (bench/mma_ceiling_wgsl.ts names them):
 * what a name stands for ({@link parseCeiling}), the problem sizes and matrix dims it runs on,
 * the tile layout it implies ({@link ceilingLayout}), why it may not fit ({@link ceilingProblem}),
 * its dispatch grid ({@link ceilingGrid}) and its FLOPs ({@link ceilingFlops}).
 * @module
 */

/** One arrangement. */
export interface Ceiling {
  name: string;
  loop: "gemm" | "flash" | "reg";
  src: "st" | "wg" | "wx";
  tm: number;
  tn: number;
  wm: number;
  wn: number;
  ku: number;
  bufs: 2 | 3;
  bn: boolean;
  /** A ladder step (bench/mma_ladder_wgsl.ts), 1 .. 4; absent for the arrangements here. */
  step?: number;
}

/** Problem sizes: gemm M x N x K; flash M rows, N keys, head K; reg L iterations, M subgroups. */
export interface CeilingSize {
  m: number;
  n: number;
  k: number;
}

/** Device matrix dims (M x K times K x N) and subgroup size. */
export interface MatrixDims {
  m: number;
  n: number;
  k: number;
  sg: number;
}

const NAME = /^(gemm|flash|reg)-(st|wg|wx)-(\d+)x(\d+)-w(\d+)x(\d+)(?:-k(\d+))?(-b3)?(-bn)?$/;

/** The arrangement a name stands for, or null. */
export function parseCeiling(name: string): Ceiling | null {
  const x = NAME.exec(name);
  if (!x) return null;
  const [tm, tn, wm, wn] = [x[3], x[4], x[5], x[6]].map(Number);
  return {
    name,
    loop: x[1] as Ceiling["loop"],
    src: x[2] as Ceiling["src"],
    tm,
    tn,
    wm,
    wn,
    ku: Number(x[7] ?? 1),
    bufs: x[8] ? 3 : 2,
    bn: Boolean(x[9]),
  };
}

/** Rows and columns of C one workgroup computes, and its workgroup-memory bytes. */
export function ceilingLayout(v: Ceiling, d: MatrixDims, size: CeilingSize) {
  const bm = v.wm * v.tm * d.m, bn = v.wn * v.tn * d.n;
  const bks = v.loop === "flash" ? size.k : v.ku * d.k; // K columns staged per step
  const astr = bks + 8, bstr = bn + 8;
  const aTile = v.loop === "gemm" && v.src !== "st" ? bm * astr : 0;
  const bTile = v.src === "st" || v.loop === "reg" ? 0 : v.bn ? bks * bstr : bn * astr;
  return { bm, bn, bks, astr, bstr, aTile, bTile, bytes: 2 * v.bufs * (aTile + bTile) };
}

/** Why `v` does not fit `size` on `d`, or null. */
export function ceilingProblem(v: Ceiling, d: MatrixDims, size: CeilingSize): string | null {
  const lay = ceilingLayout(v, d, size);
  if (v.loop === "reg") return v.src === "st" ? null : "reg loads nothing: use src st";
  if (v.loop === "flash" && v.ku !== 1) return "flash holds all of K: no -k";
  if (v.loop === "flash" && v.bn) return "flash streams K rows: no -bn";
  if (size.m % lay.bm || size.n % lay.bn) return `tile ${lay.bm}x${lay.bn} does not divide C`;
  if (size.k % lay.bks || lay.bks % 8) return `k step ${lay.bks} does not divide K`;
  const steps = v.loop === "flash" ? size.n / lay.bn : size.k / lay.bks;
  if (steps < v.bufs) return `${steps} steps: fewer than ${v.bufs} buffers`;
  return null;
}

/** The workgroups of a dispatch. */
export function ceilingGrid(v: Ceiling, d: MatrixDims, size: CeilingSize): [number, number] {
  const lay = ceilingLayout(v, d, size);
  if (v.loop === "reg") return [size.m / (v.wm * v.wn), 1];
  if (v.loop === "flash") return [size.m / lay.bm, 1];
  return [size.n / lay.bn, size.m / lay.bm];
}

/** FLOPs of one dispatch. */
export function ceilingFlops(v: Ceiling, d: MatrixDims, size: CeilingSize): number {
  if (v.loop === "reg") return 2 * d.m * d.n * d.k * v.tm * v.tn * v.ku * size.n * size.m;
  return 2 * size.m * size.n * size.k;
}
