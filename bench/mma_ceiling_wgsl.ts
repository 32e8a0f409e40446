/**
 * WGSL for the subgroup-matrix ceiling probe (bench/mma_ceiling.ts): f16 x f16 -> f32 loops
 * through `subgroupMatrixLoad` / `subgroupMatrixMultiplyAccumulate` in several arrangements,
 * named `{loop}-{src}-{tm}x{tn}-w{wm}x{wn}[-k{ku}][-b3][-bn]` ({@link parseCeiling}):
 * - loop `gemm`: C[M x N] = A[M x K] B, a k loop of KU matrix k-steps per iteration; `flash`:
 *   the QK^T pattern of attention, A (rows x D = 128) loaded once and held, B (keys x D) streamed
 *   in tiles of BN keys, every tile accumulated into the same accumulators (C = A sum_t B_t^T);
 *   `reg`: no loads in the loop at all (fragments loaded once): the issue ceiling;
 * - src `st`: fragments straight from storage; `wg`: tiles staged in workgroup memory by 16-byte
 *   loads and f16 stores; `wx`: staged by subgroupMatrixLoad from storage +
 *   subgroupMatrixStore (the driver's wide moves); staged tiles are double-buffered with one
 *   barrier a step, or `-b3` triple-buffered (every write two barriers before its read);
 * - TM x TN accumulator fragments per subgroup, WM x WN subgroups per workgroup;
 * - B is N x K row-major (col_major right loads, as K rows in the cache), or `-bn` K x N
 *   (row_major right loads, as V).
 * Bindings: 0 a: array<f16>, 1 b: array<f16>, 2 c: array<f32>, 3 a4, 4 b4: the same buffers as
 * array<vec4<u32>> (for `wg` staging).
 * Re-exported from their own modules: the arrangements, their grammar, layout and checks
 * (bench/mma_ceiling_shape.ts) and the tile staging (bench/mma_ceiling_staging.ts).
 * @module
 */
import {
  type Ceiling,
  ceilingLayout,
  type CeilingSize,
  type MatrixDims,
} from "./mma_ceiling_shape.ts";
import { stagingCode } from "./mma_ceiling_staging.ts";

export {
  type Ceiling,
  ceilingFlops,
  ceilingGrid,
  ceilingLayout,
  ceilingProblem,
  type CeilingSize,
  type MatrixDims,
  parseCeiling,
} from "./mma_ceiling_shape.ts";
export { stagingCode } from "./mma_ceiling_staging.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** The enables and bindings every probe shares (A, B, C; A and B again as 16-byte words). */
export const PROBE_HEADER: readonly string[] = [
  "enable f16;",
  "enable subgroups;",
  "enable chromium_experimental_subgroup_matrix;",
  "@group(0) @binding(0) var<storage, read> a: array<f16>;",
  "@group(0) @binding(1) var<storage, read> b: array<f16>;",
  "@group(0) @binding(2) var<storage, read_write> c: array<f32>;",
  "@group(0) @binding(3) var<storage, read> a4: array<vec4<u32>>;",
  "@group(0) @binding(4) var<storage, read> b4: array<vec4<u32>>;",
];

/** One arrangement's source in the making: layout, fragment types and ranges, extents, lines. */
interface Probe {
  lay: ReturnType<typeof ceilingLayout>;
  nsg: number;
  /** The left (A), right (B) and result (C) fragment types. */
  L: string;
  R: string;
  Res: string;
  /** Accumulator rows and columns of a subgroup; k-steps of an iteration (flash: all of K). */
  I: number[];
  J: number[];
  U: number[];
  /** K and N of the problem; the lines so far. */
  K: number;
  N: number;
  out: string[];
  /** Tiles staged in workgroup memory (`wg`, `wx`; never under `reg`). */
  staged: boolean;
  mma: (i: number, j: number, u: number) => string;
}

/** The {@link Probe} of arrangement `v` on `d` for `size`, no lines yet. */
function probeOf(v: Ceiling, d: MatrixDims, size: CeilingSize): Probe {
  const lay = ceilingLayout(v, d, size), nsg = v.wm * v.wn;
  const L = `subgroup_matrix_left<f16, ${d.k}, ${d.m}>`;
  const R = `subgroup_matrix_right<f16, ${d.n}, ${d.k}>`;
  const Res = `subgroup_matrix_result<f32, ${d.n}, ${d.m}>`;
  const I = range(v.tm), J = range(v.tn), U = range(v.loop === "flash" ? size.k / d.k : v.ku);
  const K = size.k, N = size.n, out: string[] = [];
  const staged = v.src !== "st" && v.loop !== "reg";
  const mma = (i: number, j: number, u: number) =>
    `acc_${i}_${j} = subgroupMatrixMultiplyAccumulate(a_${u}_${i}, b_${u}_${j}, acc_${i}_${j});`;
  return { lay, nsg, L, R, Res, I, J, U, K, N, out, staged, mma };
}

/** The shader module source of one arrangement. */
export function ceilingSource(v: Ceiling, d: MatrixDims, size: CeilingSize): string {
  const p = probeOf(v, d, size);
  const { lay, nsg, Res, I, J, out } = p;
  out.push(
    ...PROBE_HEADER,
  );
  if (lay.aTile) out.push(`var<workgroup> as_s: array<f16, ${v.bufs * lay.aTile}>;`);
  if (lay.bTile) out.push(`var<workgroup> bs_s: array<f16, ${v.bufs * lay.bTile}>;`);
  out.push(
    `@compute @workgroup_size(${nsg * d.sg})`,
    "@diagnostic(off, chromium.subgroup_matrix_uniformity)",
    "fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,",
    "        @builtin(local_invocation_index) t: u32) {",
    `  let sr = (sg / ${v.wn}u) * ${v.tm * d.m}u; // the subgroup's rows and columns in the tile`,
    `  let sc = (sg % ${v.wn}u) * ${v.tn * d.n}u;`,
    `  let r0 = ${v.loop === "flash" ? "wg.x" : "wg.y"} * ${lay.bm}u;`,
    `  let c0 = ${v.loop === "gemm" ? `wg.x * ${lay.bn}u` : "0u"};`,
    ...I.flatMap((i) => J.map((j) => `  var acc_${i}_${j} = ${Res}();`)),
  );
  if (v.loop === "reg") {
    regLoop(v, d, size, p);
    return out.join("\n");
  }
  keyLoop(v, d, size, p);
  return out.join("\n");
}

/** `reg`: fragments loaded once, then only multiply-accumulates in the loop; C stored. */
function regLoop(v: Ceiling, d: MatrixDims, size: CeilingSize, p: Probe): void {
  const { nsg, L, R, I, J, out, mma } = p;
  const g = `(wg.x * ${nsg}u + sg) * ${v.tm * d.m}u`;
  out.push(
    ...I.map((i) =>
      `  let a_0_${i} = subgroupMatrixLoad<${L}, row_major>(&a, (${g} + ${
        i * d.m
      }u) * ${d.k}u, ${d.k}u);`
    ),
    ...J.map((j) =>
      `  let b_0_${j} = subgroupMatrixLoad<${R}, col_major>(&b, ${j * d.n * d.k}u, ${d.k}u);`
    ),
    `  for (var it = 0u; it < ${size.n}u; it++) {`,
    ...range(v.ku).flatMap(() => I.flatMap((i) => J.map((j) => "    " + mma(i, j, 0)))),
    "  }",
  );
  out.push(...storeC(v, d, g, "0u", v.tn * d.n), "}");
}

/** The k (gemm) or key (flash) loop over steps, from storage or staged tiles; C stored. */
function keyLoop(v: Ceiling, d: MatrixDims, size: CeilingSize, p: Probe): void {
  const { lay, I, U, K, N, out, staged } = p;
  const steps = v.loop === "flash" ? N / lay.bn : K / lay.bks;
  const { loadA, compute } = stepCode(v, d, p);
  if (v.loop === "flash") out.push(...U.flatMap((u) => I.map((i) => loadA(u, i, "  "))));
  const step = v.loop === "flash" ? lay.bn : lay.bks;
  if (!staged) {
    out.push(`  for (var kk = 0u; kk < ${steps * step}u; kk += ${step}u) {`);
    out.push(...compute("    "), "  }");
  } else {
    const st = stagingCode(v, d, size, lay);
    out.push(
      ...range(v.bufs - 1).flatMap((p) => [
        "  {",
        `    let kn = ${p * step}u;`,
        `    let nb = ${p}u;`,
        "    let more = true;",
        ...st.load.map((x) => "    " + x),
        ...st.store.map((x) => "    " + x),
        "  }",
      ]),
      "  workgroupBarrier();",
      `  for (var it = 0u; it < ${steps}u; it++) {`,
      `    let kk = it * ${step}u;`,
      `    let cur = it % ${v.bufs}u;`,
      `    let ab = cur * ${lay.aTile}u;`,
      `    let bb = cur * ${lay.bTile}u;`,
      `    let kn = kk + ${(v.bufs - 1) * step}u; // the tile staged now`,
      `    let nb = (it + ${v.bufs - 1}u) % ${v.bufs}u;`,
      `    let more = it + ${v.bufs - 1}u < ${steps}u;`,
      ...st.load.map((x) => "    " + x),
      ...compute("    "),
      "    if (more) {",
      ...st.store.map((x) => "      " + x),
      "    }",
      "    workgroupBarrier();",
      "  }",
    );
  }
  out.push(...storeC(v, d, "r0 + sr", "c0 + sc", v.loop === "flash" ? lay.bn : N), "}");
}

/** One step's fragment loads and MMAs (`compute`), and A's loads alone (`loadA`). */
function stepCode(v: Ceiling, d: MatrixDims, p: Probe) {
  const { lay, L, R, I, J, U, K, N, staged, mma } = p;
  const bMajor = v.bn ? "row_major" : "col_major";
  // Fragment addresses: A rows `r`, k offset `kk`; B column `c`, k offset `kk`.
  const aSt = (r: string, kk: string) => `&a, (${r}) * ${K}u + ${kk}, ${K}u`;
  const bSt = (c: string, kk: string) =>
    v.bn ? `&b, (${kk}) * ${N}u + ${c}, ${N}u` : `&b, (${c}) * ${K}u + ${kk}, ${K}u`;
  const aWg = (r: string, kk: string) => `&as_s, ab + (${r}) * ${lay.astr}u + ${kk}, ${lay.astr}u`;
  const bWg = (c: string, kk: string) =>
    v.bn
      ? `&bs_s, bb + (${kk}) * ${lay.bstr}u + ${c}, ${lay.bstr}u`
      : `&bs_s, bb + (${c}) * ${lay.astr}u + ${kk}, ${lay.astr}u`;
  // One step's loads and MMAs; `kk` the step's first k (gemm) or key (flash).
  const fragA = (u: number, i: number) =>
    staged && v.loop === "gemm"
      ? aWg(`sr + ${i * d.m}u`, `${u * d.k}u`)
      : aSt(`r0 + sr + ${i * d.m}u`, v.loop === "flash" ? `${u * d.k}u` : `kk + ${u * d.k}u`);
  const fragB = (u: number, j: number) => {
    if (staged) return bWg(`sc + ${j * d.n}u`, `${u * d.k}u`);
    return v.loop === "flash"
      ? bSt(`kk + sc + ${j * d.n}u`, `${u * d.k}u`)
      : bSt(`c0 + sc + ${j * d.n}u`, `kk + ${u * d.k}u`);
  };
  const loadA = (u: number, i: number, pad: string) =>
    `${pad}let a_${u}_${i} = subgroupMatrixLoad<${L}, row_major>(${fragA(u, i)});`;
  const compute = (pad: string) =>
    U.flatMap((u) => [
      ...(v.loop === "flash" ? [] : I.map((i) => loadA(u, i, pad))),
      ...J.map((j) =>
        `${pad}let b_${u}_${j} = subgroupMatrixLoad<${R}, ${bMajor}>(${fragB(u, j)});`
      ),
      ...I.flatMap((i) => J.map((j) => pad + mma(i, j, u))),
    ]);
  return { loadA, compute };
}

/** Stores the accumulators at rows `r`, columns `c` of C (row stride `ldc`). */
function storeC(v: Ceiling, d: MatrixDims, r: string, c: string, ldc: number): string[] {
  return range(v.tm).flatMap((i) =>
    range(v.tn).map((j) =>
      `  subgroupMatrixStore<row_major>(&c, (${r} + ${i * d.m}u) * ${ldc}u + ${c} + ${
        j * d.n
      }u, acc_${i}_${j}, ${ldc}u);`
    )
  );
}
