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

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

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

/** The shader module source of one arrangement. */
export function ceilingSource(v: Ceiling, d: MatrixDims, size: CeilingSize): string {
  const lay = ceilingLayout(v, d, size), nsg = v.wm * v.wn;
  const L = `subgroup_matrix_left<f16, ${d.k}, ${d.m}>`;
  const R = `subgroup_matrix_right<f16, ${d.n}, ${d.k}>`;
  const Res = `subgroup_matrix_result<f32, ${d.n}, ${d.m}>`;
  const I = range(v.tm), J = range(v.tn), U = range(v.loop === "flash" ? size.k / d.k : v.ku);
  const K = size.k, N = size.n, out: string[] = [];
  const bMajor = v.bn ? "row_major" : "col_major";
  const staged = v.src !== "st" && v.loop !== "reg";
  // Fragment addresses: A rows `r`, k offset `kk`; B column `c`, k offset `kk`.
  const aSt = (r: string, kk: string) => `&a, (${r}) * ${K}u + ${kk}, ${K}u`;
  const bSt = (c: string, kk: string) =>
    v.bn ? `&b, (${kk}) * ${N}u + ${c}, ${N}u` : `&b, (${c}) * ${K}u + ${kk}, ${K}u`;
  const aWg = (r: string, kk: string) => `&as_s, ab + (${r}) * ${lay.astr}u + ${kk}, ${lay.astr}u`;
  const bWg = (c: string, kk: string) =>
    v.bn
      ? `&bs_s, bb + (${kk}) * ${lay.bstr}u + ${c}, ${lay.bstr}u`
      : `&bs_s, bb + (${c}) * ${lay.astr}u + ${kk}, ${lay.astr}u`;
  const mma = (i: number, j: number, u: number) =>
    `acc_${i}_${j} = subgroupMatrixMultiplyAccumulate(a_${u}_${i}, b_${u}_${j}, acc_${i}_${j});`;
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
    return out.join("\n");
  }
  const steps = v.loop === "flash" ? N / lay.bn : K / lay.bks;
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
  return out.join("\n");
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

/**
 * Staging of the tile at step start `kn` into buffer `nb`: `load` fetches into registers (moved
 * before the step's matrix work), `store` writes workgroup memory (after it; under `more`).
 */
export function stagingCode(
  v: Ceiling,
  d: MatrixDims,
  size: CeilingSize,
  lay: ReturnType<typeof ceilingLayout>,
): { load: string[]; store: string[] } {
  const nsg = v.wm * v.wn, wg = nsg * d.sg, K = size.k, N = size.n;
  const flash = v.loop === "flash";
  // Tiles: [array, rows, cols (f16), storage row of tile row `r`, storage col, row stride].
  const tiles: { s: string; g: string; rows: number; cols: number; at: string; ld: number }[] = [];
  if (!flash) {
    tiles.push({
      s: "as",
      g: "a",
      rows: lay.bm,
      cols: lay.bks,
      at: `(r0 + R) * ${K}u + kn + C`,
      ld: lay.astr,
    });
  }
  if (v.bn) {
    tiles.push({
      s: "bs",
      g: "b",
      rows: lay.bks,
      cols: lay.bn,
      at: `(kn + R) * ${N}u + c0 + C`,
      ld: lay.bstr,
    });
  } else {
    const row = flash ? "kn + R" : "c0 + R", col = flash ? "C" : "kn + C";
    tiles.push({
      s: "bs",
      g: "b",
      rows: lay.bn,
      cols: lay.bks,
      at: `(${row}) * ${K}u + ${col}`,
      ld: lay.astr,
    });
  }
  const load: string[] = [], store: string[] = [];
  const size0 = (s: string) => (s === "as" ? lay.aTile : lay.bTile);
  for (const tl of tiles) {
    const base = `nb * ${size0(tl.s)}u`;
    if (v.src === "wg") {
      const words = (tl.rows * tl.cols) / 8, wpr = tl.cols / 8;
      for (const w of range(Math.ceil(words / wg))) {
        const idx = `(t + ${w * wg}u)`, guard = words % wg ? `${idx} < ${words}u` : "true";
        const R = `${idx} / ${wpr}u`, C = `(${idx} % ${wpr}u) * 8u`;
        const at = tl.at.replace("R", R).replace("C", C);
        load.push(`var ${tl.s}w${w} = vec4<u32>(0u);`);
        load.push(`if (more && ${guard}) { ${tl.s}w${w} = ${tl.g}4[(${at}) / 8u]; }`);
        store.push(`if (${guard}) {`, `  let o = ${base} + (${R}) * ${tl.ld}u + ${C};`);
        for (const e of range(8)) {
          const half = `bitcast<vec2<f16>>(${tl.s}w${w}.${"xyzw"[e >> 1]})[${e & 1}]`;
          store.push(`  ${tl.s}_s[o + ${e}u] = ${half};`);
        }
        store.push("}");
      }
    } else {
      // wx: fragments of the tile, subgroup sg moves fragments sg, sg + NSG, ...
      const isA = tl.s === "as";
      const fm = isA ? d.m : v.bn ? d.k : d.n, fn = isA ? d.k : v.bn ? d.n : d.k;
      const T = isA
        ? `subgroup_matrix_left<f16, ${d.k}, ${d.m}>`
        : `subgroup_matrix_right<f16, ${d.n}, ${d.k}>`;
      const major = isA || v.bn ? "row_major" : "col_major";
      const fr = tl.rows / fm, fc = tl.cols / fn, count = fr * fc;
      for (const w of range(Math.ceil(count / nsg))) {
        const f = `(sg + ${w * nsg}u)`, guard = count % nsg ? `${f} < ${count}u` : "true";
        const R = `(${f} / ${fc}u) * ${fm}u`, C = `(${f} % ${fc}u) * ${fn}u`;
        const at = tl.at.replace("R", R).replace("C", C);
        load.push(`var ${tl.s}f${w}: ${T};`);
        load.push(`if (more && ${guard}) {`);
        load.push(
          `  ${tl.s}f${w} = subgroupMatrixLoad<${T}, ${major}>(&${tl.g}, ${at}, ${
            isA ? K : v.bn ? N : K
          }u);`,
        );
        load.push("}");
        store.push(`if (${guard}) {`);
        store.push(
          `  subgroupMatrixStore<${major}>(&${tl.s}_s, ${base} + (${R}) * ${tl.ld}u + ${C}, ` +
            `${tl.s}f${w}, ${tl.ld}u);`,
        );
        store.push("}");
      }
    }
  }
  return { load, store };
}
