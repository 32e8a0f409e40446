/**
 * The ladder of the subgroup-matrix ceiling probe (bench/mma_ceiling.ts): loops that grow the
 * QK^T pattern `flash-wg-1x1-w8x1` into the attention kernel one step at a time, each keeping the
 * previous step's work, all on the flash sizes (rows x keys, head D), 8 subgroups of 1 fragment
 * row each, K (and V) tiles of BN = one fragment of keys staged by f16 stores, double-buffered:
 * - `ladder-qk` (L1): `flash-wg-1x1-w8x1` itself (C = Q sum_t K_t^T; QK^T FLOPs);
 * - `ladder-s` (L2): S_t = Q K_t^T fresh each tile, subgroupMatrixStore'd to workgroup memory
 *   (f32), converted to f16 by a lane pass, loaded back as a left matrix P_t and consumed by one
 *   MMA with a fixed right fragment V0 (V's first BN rows and first fragment of columns) held in
 *   registers: C = sum_t P_t V0 (QK^T FLOPs only; the consumer MMA, 1/(D/16) of PV, uncounted);
 * - `ladder-pv` (L3): + V tiles staged like K and PV into D/16 accumulators: C = (Q K^T) V with no
 *   softmax (QK^T + PV FLOPs, as for L4);
 * - `ladder-sm` (L4): the lane pass becomes a per-row softmax (lane i < M owns row i: max, exp,
 *   row sum): P_t = exp(S_t - rowmax_t), C = sum_t P_t V_t unnormalized, plus the row sums
 *   l = sum exp after the rows x D outputs;
 * - `ladder-pg` (L5): + paged K/V: key `k` is row table[k / 16] * 16 + k % 16 of K and of V;
 *   the block table (N / 16 u32 pages drawn from the N / 16, with a repeat) after V in binding 1;
 *   each staging load reads its table entry first (a dependent load, as the kernel's table walk).
 * Each tile has three workgroup barriers (after S's store, after the pass, after staging).
 * K and V share binding 1 (V after the N x D K rows). Bindings as bench/mma_ceiling_wgsl.ts's.
 * @module
 */
import {
  type Ceiling,
  ceilingLayout,
  type CeilingSize,
  ceilingSource,
  type MatrixDims,
  parseCeiling,
  PROBE_HEADER,
  stagingCode,
} from "./mma_ceiling_wgsl.ts";

/** Ladder names and their steps (L1 .. L4). */
export const LADDER_STEPS: Record<string, number> = {
  "ladder-qk": 1,
  "ladder-s": 2,
  "ladder-pv": 3,
  "ladder-sm": 4,
  "ladder-pg": 5,
};

/** Rows per page of `ladder-pg`'s block table. */
export const LADDER_PAGE = 16;

/** The arrangement of a ladder name (`step` set), or null. */
export function parseLadder(name: string): Ceiling | null {
  const step = LADDER_STEPS[name];
  if (!step) return null;
  return { ...parseCeiling("flash-wg-1x1-w8x1")!, name, step };
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** Output columns per row (C's row stride) of a step >= 2. */
export function ladderColumns(v: Ceiling, d: MatrixDims, s: CeilingSize): number {
  return (v.step ?? 0) >= 3 ? s.k : d.n;
}

/** Workgroup bytes: K (and V) double-buffered tiles, S (f32) and P (f16) per subgroup. */
export function ladderBytes(v: Ceiling, d: MatrixDims, s: CeilingSize): number {
  const lay = ceilingLayout(v, d, s), nsg = v.wm * v.wn, tiles = (v.step ?? 0) >= 3 ? 2 : 1;
  return tiles * lay.bytes + nsg * d.m * lay.bn * (4 + 2);
}

/** FLOPs counted: QK^T, + PV from L3. */
export function ladderFlops(v: Ceiling, s: CeilingSize): number {
  return ((v.step ?? 0) >= 3 ? 4 : 2) * s.m * s.n * s.k;
}

/** The shader of a ladder step (L1 is `flash-wg-1x1-w8x1`'s). */
export function ladderSource(v: Ceiling, d: MatrixDims, s: CeilingSize): string {
  const step = v.step ?? 1;
  if (step < 2) return ceilingSource(v, d, s);
  const lay = ceilingLayout(v, d, s), nsg = v.wm * v.wn, D = s.k, N = s.n;
  const M = d.m, BN = lay.bn, SP = M * BN, steps = N / BN;
  const L = `subgroup_matrix_left<f16, ${d.k}, ${d.m}>`;
  const R = `subgroup_matrix_right<f16, ${d.n}, ${d.k}>`;
  const Res = `subgroup_matrix_result<f32, ${d.n}, ${d.m}>`;
  const U = range(D / d.k), J = range(step >= 3 ? D / d.n : 1), ldc = ladderColumns(v, d, s);
  const st = stagingCode(v, d, s, lay);
  const paged = (x: string) => step >= 5 ? x.replaceAll("b4[((kn + ", "b4[(page(kn + ") : x;
  const vst = (x: string) => x.replaceAll("bs", "vs").replaceAll("b4[(", `b4[(${N * D}u + `);
  const load0 = st.load.map(paged);
  const load = step >= 3 ? [...load0, ...load0.map(vst)] : load0;
  const store = step >= 3 ? [...st.store, ...st.store.map(vst)] : st.store;
  const pass = step >= 4
    ? [
      `if (lane < ${M}u) {`,
      `  let o = sp + lane * ${BN}u;`,
      "  var mx = s_s[o];",
      ...range(BN - 1).map((j) => `  mx = max(mx, s_s[o + ${j + 1}u]);`),
      ...range(BN).flatMap((j) => [
        `  let e${j} = exp(s_s[o + ${j}u] - mx);`,
        `  p_s[o + ${j}u] = f16(e${j});`,
      ]),
      `  l += ${range(BN).map((j) => `e${j}`).join(" + ")};`,
      "}",
    ]
    : [`for (var e = lane; e < ${SP}u; e += ${d.sg}u) { p_s[sp + e] = f16(s_s[sp + e]); }`];
  const out = [
    ...PROBE_HEADER,
    `var<workgroup> bs_s: array<f16, ${2 * lay.bTile}>;`,
    ...(step >= 3 ? [`var<workgroup> vs_s: array<f16, ${2 * lay.bTile}>;`] : []),
    `var<workgroup> s_s: array<f32, ${nsg * SP}>;`,
    `var<workgroup> p_s: array<f16, ${nsg * SP}>;`,
    ...(step >= 5 ? pageFn(N * D) : []),
    `@compute @workgroup_size(${nsg * d.sg})`,
    "@diagnostic(off, chromium.subgroup_matrix_uniformity)",
    "fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,",
    "        @builtin(local_invocation_index) t: u32,",
    "        @builtin(subgroup_invocation_id) lane: u32) {",
    `  let sr = sg * ${M}u;`,
    `  let r0 = wg.x * ${lay.bm}u;`,
    `  let sp = sg * ${SP}u; // this subgroup's S and P`,
    ...U.map((u) =>
      `  let a_${u} = subgroupMatrixLoad<${L}, row_major>(&a, (r0 + sr) * ${D}u + ${
        u * d.k
      }u, ${D}u);`
    ),
    ...(step === 2
      ? [`  let v0 = subgroupMatrixLoad<${R}, row_major>(&b, ${N * D}u, ${D}u);`]
      : []),
    ...J.map((j) => `  var o_${j} = ${Res}();`),
    "  var l = 0.0;",
    "  {",
    "    let kn = 0u;",
    "    let nb = 0u;",
    "    let more = true;",
    ...load.map((x) => "    " + x),
    ...store.map((x) => "    " + x),
    "  }",
    "  workgroupBarrier();",
    `  for (var it = 0u; it < ${steps}u; it++) {`,
    `    let bb = (it % 2u) * ${lay.bTile}u;`,
    `    let kn = (it + 1u) * ${BN}u; // the tile staged now`,
    "    let nb = (it + 1u) % 2u;",
    `    let more = it + 1u < ${steps}u;`,
    ...load.map((x) => "    " + x),
    `    var s = ${Res}();`,
    ...U.flatMap((u) => [
      `    let b_${u} = subgroupMatrixLoad<${R}, col_major>(&bs_s, bb + ${
        u * d.k
      }u, ${lay.astr}u);`,
      `    s = subgroupMatrixMultiplyAccumulate(a_${u}, b_${u}, s);`,
    ]),
    `    subgroupMatrixStore<row_major>(&s_s, sp, s, ${BN}u);`,
    "    workgroupBarrier();",
    ...pass.map((x) => "    " + x),
    "    workgroupBarrier();",
    `    let p = subgroupMatrixLoad<${L}, row_major>(&p_s, sp, ${BN}u);`,
    ...(step === 2 ? ["    o_0 = subgroupMatrixMultiplyAccumulate(p, v0, o_0);"] : J.flatMap((
      j,
    ) => [
      `    let v_${j} = subgroupMatrixLoad<${R}, row_major>(&vs_s, bb + ${
        j * d.n
      }u, ${lay.astr}u);`,
      `    o_${j} = subgroupMatrixMultiplyAccumulate(p, v_${j}, o_${j});`,
    ])),
    "    if (more) {",
    ...store.map((x) => "      " + x),
    "    }",
    "    workgroupBarrier();",
    "  }",
    ...J.map((j) =>
      `  subgroupMatrixStore<row_major>(&c, (r0 + sr) * ${ldc}u + ${j * d.n}u, o_${j}, ${ldc}u);`
    ),
    ...(step >= 4 ? [`  if (lane < ${M}u) { c[${s.m * ldc}u + r0 + sr + lane] = l; }`] : []),
    "}",
  ];
  return out.join("\n");
}

/** WGSL `page(key)`: the cache row of a key, through the u32 block table at u32 index `at`. */
export function pageFn(at: number): string[] {
  return [
    "fn page(key: u32) -> u32 {",
    `  let i = ${at}u + key / ${LADDER_PAGE}u;`,
    `  return b4[i / 4u][i % 4u] * ${LADDER_PAGE}u + key % ${LADDER_PAGE}u;`,
    "}",
  ];
}

/** Element counts of Q, K + V and C of a step >= 2 (C: rows x columns, + row sums for L4). */
export function ladderExtents(v: Ceiling, d: MatrixDims, s: CeilingSize) {
  const ldc = ladderColumns(v, d, s);
  const table = (v.step ?? 0) >= 5 ? 2 * (s.n / LADDER_PAGE) : 0; // u32s, in f16 units
  return {
    a: s.m * s.k,
    b: 2 * s.n * s.k + table,
    c: s.m * ldc + ((v.step ?? 0) >= 4 ? s.m : 0),
    ldc,
  };
}

/**
 * The float64 value of C[r, col] of a step >= 2 and the sum of |terms| (the tolerance's scale);
 * `col` = the row-sum column (`ldc`) for L4's l. P is rounded to f16 as the shader rounds it.
 */
export function ladderExpected(
  v: Ceiling,
  d: MatrixDims,
  s: CeilingSize,
  q: Float16Array,
  kv: Float16Array,
  r: number,
  col: number,
): [number, number] {
  const step = v.step ?? 0, D = s.k, bn = ceilingLayout(v, d, s).bn, vBase = s.n * D;
  const p16 = new Float16Array(bn), e = new Float64Array(bn);
  const table = new Uint32Array(kv.buffer, 2 * vBase * 2, step >= 5 ? s.n / LADDER_PAGE : 0);
  const row = (key: number) =>
    step >= 5 ? table[Math.floor(key / LADDER_PAGE)] * LADDER_PAGE + key % LADDER_PAGE : key;
  let sum = 0, mag = 0;
  for (let t = 0; t < s.n; t += bn) {
    let mx = -Infinity;
    for (let j = 0; j < bn; j++) {
      let dot = 0;
      for (let k = 0; k < D; k++) dot += q[r * D + k] * kv[row(t + j) * D + k];
      e[j] = dot;
      mx = Math.max(mx, dot);
    }
    for (let j = 0; j < bn; j++) {
      if (step >= 4) e[j] = Math.exp(e[j] - mx);
      p16[j] = e[j];
    }
    for (let j = 0; j < bn; j++) {
      if (col === ladderColumns(v, d, s)) {
        sum += e[j];
        mag += e[j];
        continue;
      }
      const x = p16[j] * kv[vBase + (step === 2 ? j : row(t + j)) * D + col];
      sum += x;
      mag += Math.abs(x);
    }
  }
  return [sum, mag];
}

/** Writes `ladder-pg`'s block table (random pages, with repeats) after K and V in `kv`. */
export function fillBlockTable(v: Ceiling, s: CeilingSize, kv: Float16Array): void {
  if ((v.step ?? 0) < 5) return;
  const pages = s.n / LADDER_PAGE, table = new Uint32Array(kv.buffer, 4 * s.n * s.k, pages);
  // Drawn with repeats, and page 1 always repeats page 0: attention is blind to a permutation of
  // keys, so a permutation would let a shader that ignores the table pass the check.
  for (let i = 0; i < pages; i++) table[i] = Math.floor(Math.random() * pages);
  if (pages > 1) table[1] = table[0];
}
