/**
 * The v0.7 ladder (bench/NOTES.md, "v0.7 ladder (branch mma4)"): `ladder-sm` / `ladder-pg`
 * (bench/mma_ladder_wgsl.ts's L4 / L5: QK^T, S through workgroup memory, a per-row softmax pass,
 * P V; L5 through a block table) reshaped along the ways out of the kernel's 44-54 TFLOP/s,
 * named `ladder-{sm|pg}-k{BK}-w{NSG}[-r1][-sb|-sl|-2b|-nb]` ({@link parseLadder2}):
 * - `k{BK}`: keys per tile (a multiple of the matrix's N): BK / N S fragments per subgroup per
 *   tile, so the same barriers cover BK / N times the MMAs (the old ladder: one fragment);
 * - `w{NSG}`: subgroups (of one fragment row, M rows) per workgroup;
 * - softmax pass: by default spread over every lane (LPR = SG / M lanes a row, BK / LPR keys a
 *   lane, row max and sum by subgroupShuffleXor); `-r1`: one lane a row (the old ladder's);
 * - schedule: by default (`3b`) double-buffered K/V tiles, three barriers a tile (after S's
 *   store, after the pass, after staging: the old ladder's); `-sb` single-buffered K/V (half
 *   the tile memory) in the same three barriers, every K/V write two barriers before its read
 *   (K stored after the S barrier, V at the top of the next tile); `-sl` the same with late
 *   loads (each tile's words fetched where they are stored: no staging registers held across
 *   the matrix work, the loads' latency exposed); `-2b` software-pipelined:
 *   QK^T of the next tile and PV of this one between the same two barriers (S, then P, K and V
 *   after them), two barriers a tile; `-nb`: `3b` without the two barriers around the
 *   subgroup's own S and P (one barrier a tile; a data race by WGSL's rules: only the float64
 *   check says whether the device orders a subgroup's own workgroup-memory hand-offs);
 * - `-h{N}` (after the schedule): N extra f32 values held live across the key loop (loaded from
 *   Q before it, loop-carried through a branch the device never takes, written only by a
 *   workgroup that does not exist): the kernel's row state (positions, output offsets, running
 *   max and sum, flags) in registers, without its arithmetic: whether registers, through
 *   occupancy, cost what the kernel loses against this probe.
 * S is f32 (row stride BK + 4), P f16 (BK + 8), one region each per subgroup; K/V tiles f16,
 * row stride D + 8, staged by 16-byte loads and f16 stores (bench/mma_ceiling_wgsl.ts's
 * `stagingCode`). The outputs and their float64 reference are the old ladder's
 * (`ladderExpected` with a per-tile max over BK keys).
 * @module
 */
import {
  type Ceiling,
  ceilingLayout,
  type CeilingSize,
  type MatrixDims,
  parseCeiling,
  PROBE_HEADER,
  stagingCode,
} from "./mma_ceiling_wgsl.ts";
import { ladderColumns, pageFn } from "./mma_ladder_wgsl.ts";
import { type Schedule, scheduleBody } from "./mma_ladder2_schedule.ts";

/** A v0.7 ladder probe: L4 (`sm`) or L5 (`pg`) with a key tile, a schedule, a softmax spread. */
export interface Ladder2 extends Ceiling {
  /** `3b` (default), `sb` single-buffered K/V, `2b` pipelined, `nb` no S/P barriers. */
  sched: Schedule;
  /** One lane a row in the softmax pass (`-r1`) instead of all lanes. */
  rowLane: boolean;
  /** Keys per tile. */
  bk: number;
  /** Extra f32 values held live across the key loop (`-h{N}`; 0: none). */
  hold: number;
  /**
   * `-x{letters}`, the kernel's loop forms, results unchanged: `d` the trip count known only at
   * run time (as the kernel's kstart..kend), `g` each lane's staging load guarded by its key
   * against a run-time key count (as the kernel's `key < kend`), `p` P written over the tile's
   * dead K (the kernel's kt_s; 3b schedule only) instead of its own array.
   */
  kernelForms: string;
}

const NAME = /^ladder-(sm|pg)-k(\d+)-w(\d+)(-r1)?(?:-(sb|sl|2b|nb))?(?:-h(\d+))?(?:-x([dgp]+))?$/;

/** The probe a v0.7 ladder name stands for on matrices `d`, or null. */
export function parseLadder2(name: string, d: MatrixDims): Ladder2 | null {
  const x = NAME.exec(name);
  if (!x) return null;
  const bk = Number(x[2]), nsg = Number(x[3]);
  return {
    ...parseCeiling("flash-wg-1x1-w8x1")!,
    name,
    step: x[1] === "sm" ? 4 : 5,
    tn: Math.max(1, Math.floor(bk / d.n)), // ceilingLayout's bn = BK (the reference's tile)
    wm: nsg,
    wn: 1,
    bufs: 2,
    bk,
    rowLane: Boolean(x[4]),
    sched: (x[5] ?? "3b") as Ladder2["sched"],
    hold: Number(x[6] ?? 0),
    kernelForms: x[7] ?? "",
  };
}

/** Whether `v` is a v0.7 ladder probe. */
export function isLadder2(v: Ceiling): v is Ladder2 {
  return "sched" in v;
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** The softmax pass's lanes per row, rows per lane and whether every lane takes part. */
function lanesOf(v: Ladder2, d: MatrixDims) {
  if (v.rowLane || d.sg < d.m) {
    return { lpr: 1, rpl: Math.max(1, d.m / d.sg), all: d.sg <= d.m };
  }
  return { lpr: d.sg / d.m, rpl: 1, all: true };
}

/** Why `v` cannot run on `d` (beside bench/mma_ceiling_wgsl.ts's checks), or null. */
export function ladder2Problem(v: Ladder2, d: MatrixDims): string | null {
  const ln = lanesOf(v, d);
  if (v.bk % d.n || v.bk % d.k) return `k${v.bk} is not a multiple of ${d.n} and ${d.k}`;
  if (d.sg % d.m && d.m % d.sg) return `subgroup ${d.sg} and ${d.m} rows do not nest`;
  if (v.bk % ln.lpr) return `k${v.bk} keys over ${ln.lpr} lanes a row`;
  if (v.kernelForms.includes("p") && v.sched !== "3b") return "-xp needs the 3b schedule";
  return null;
}

/** K/V tile buffers: 1 for the single-buffered schedules, else 2. */
function ladder2Buffers(v: Ladder2): number {
  return v.sched === "sb" || v.sched === "sl" ? 1 : 2;
}

/** Workgroup bytes: K and V tiles (one or two buffers), S (f32) and P (f16) per subgroup. */
export function ladder2Bytes(v: Ladder2, d: MatrixDims, s: CeilingSize): number {
  const nbuf = ladder2Buffers(v), tile = v.bk * (s.k + 8), p = v.wm * d.m * (v.bk + 8);
  if (v.kernelForms.includes("p")) {
    return 2 * nbuf * (Math.max(tile, p) + tile) + v.wm * d.m * (v.bk + 4) * 4;
  }
  return 2 * 2 * nbuf * tile + v.wm * d.m * ((v.bk + 4) * 4 + (v.bk + 8) * 2);
}

/** The shader of a v0.7 ladder probe. */
export function ladder2Source(v: Ladder2, d: MatrixDims, s: CeilingSize): string {
  const nsg = v.wm, M = d.m, D = s.k, N = s.n, BK = v.bk, steps = N / BK;
  const KSTR = D + 8, SSTR = BK + 4, PSTR = BK + 8, tile = BK * KSTR;
  const L = `subgroup_matrix_left<f16, ${d.k}, ${d.m}>`;
  const R = `subgroup_matrix_right<f16, ${d.n}, ${d.k}>`;
  const Res = `subgroup_matrix_result<f32, ${d.n}, ${d.m}>`;
  const mma = "subgroupMatrixMultiplyAccumulate";
  // -xp: P over the dead K tile (bs_s buffers of KT elements, `bk` this tile's).
  const pk = v.kernelForms.includes("p"), KT = pk ? Math.max(tile, nsg * M * PSTR) : tile;
  const pAt = pk ? "&bs_s, bk + pp" : "&p_s, pp", pIdx = pk ? "bs_s[bk + " : "p_s[";
  const U = range(D / d.k), NB = range(BK / d.n), KB = range(BK / d.k), J = range(D / d.n);
  const ldc = ladderColumns(v, d, s), ln = lanesOf(v, d), KPL = BK / ln.lpr;
  const RPL = range(ln.rpl), E = range(KPL);
  const st = stagingCode(v, d, s, ceilingLayout(v, d, s));
  const paged = (x: string) => v.step === 5 ? x.replaceAll("b4[((kn + ", "b4[(page(kn + ") : x;
  const vst = (x: string) => x.replaceAll("bs", "vs").replaceAll("b4[(", `b4[(${N * D}u + `);
  const guarded = (x: string) =>
    v.kernelForms.includes("g") ? x.replaceAll("more && true", "kn + t / 16u < nkeys") : x;
  const kLoad = st.load.map(paged).map(guarded), vLoad = kLoad.map(vst);
  const kStore = pk ? st.store.map((x) => x.replaceAll(`nb * ${tile}u`, `nb * ${KT}u`)) : st.store;
  const vStore = st.store.map(vst);
  const qk = (kb: string) => [
    "{",
    ...NB.map((c) => `  var s_${c} = ${Res}();`),
    ...U.flatMap((u) =>
      NB.flatMap((c) => [
        `  let k_${u}_${c} = subgroupMatrixLoad<${R}, col_major>(&bs_s, ${kb} + ${
          c * d.n * KSTR + u * d.k
        }u, ${KSTR}u);`,
        `  s_${c} = ${mma}(a_${u}, k_${u}_${c}, s_${c});`,
      ])
    ),
    ...NB.map((c) => `  subgroupMatrixStore<row_major>(&s_s, sp + ${c * d.n}u, s_${c}, ${SSTR}u);`),
    "}",
  ];
  const pv = (vb: string) => [
    "{",
    ...KB.map((kk) =>
      `  let p_${kk} = subgroupMatrixLoad<${L}, row_major>(${pAt} + ${kk * d.k}u, ${PSTR}u);`
    ),
    ...KB.flatMap((kk) =>
      J.flatMap((j) => [
        `  let v_${kk}_${j} = subgroupMatrixLoad<${R}, row_major>(&vs_s, ${vb} + ${
          kk * d.k * KSTR + j * d.n
        }u, ${KSTR}u);`,
        `  o_${j} = ${mma}(p_${kk}, v_${kk}_${j}, o_${j});`,
      ])
    ),
    "}",
  ];
  const rowOf = (i: number) => `lane / ${ln.lpr}u + ${i * (d.sg / ln.lpr)}u`;
  const pass = RPL.flatMap((i) => {
    const body = [
      "{",
      `  let o = sp + (${rowOf(i)}) * ${SSTR}u + (lane % ${ln.lpr}u) * ${KPL}u;`,
      `  let q = pp + (${rowOf(i)}) * ${PSTR}u + (lane % ${ln.lpr}u) * ${KPL}u;`,
      ...E.map((e) => `  let x${e} = s_s[o + ${e}u];`),
      `  var mx = ${maxTree(E.map((e) => `x${e}`))};`,
      ...range(Math.log2(ln.lpr)).map((b) => `  mx = max(mx, subgroupShuffleXor(mx, ${1 << b}u));`),
      ...E.flatMap((e) => [`  let e${e} = exp(x${e} - mx);`, `  ${pIdx}q + ${e}u] = f16(e${e});`]),
      `  l_${i} += ${sumTree(E.map((e) => `e${e}`))};`,
      "}",
    ];
    return ln.all ? body : [`if (lane < ${M}u) {`, ...body.map((x) => "  " + x), "}"];
  });
  const block = (kn: string, nb: string, more: string, body: string[]) => [
    "{",
    `  let kn = ${kn};`,
    `  let nb = ${nb};`,
    `  let more = ${more};`,
    ...body.map((x) => "  " + x),
    "}",
  ];
  const guard = (cond: string, body: string[]) => [
    `if (${cond}) {`,
    ...body.map((x) => "  " + x),
    "}",
  ];
  const bar = "workgroupBarrier();";
  const loopBody = scheduleBody(v.sched, {
    BK,
    tile,
    steps,
    qk,
    pv,
    pass,
    bar,
    kLoad,
    vLoad,
    kStore,
    vStore,
    block,
    guard,
  });
  const H = range(v.hold), held = holdCode(H, "wg.x + 1000000u");
  const out = [
    ...PROBE_HEADER,
    `var<workgroup> bs_s: array<f16, ${ladder2Buffers(v) * KT}>;`,
    `var<workgroup> vs_s: array<f16, ${ladder2Buffers(v) * tile}>;`,
    `var<workgroup> s_s: array<f32, ${nsg * M * SSTR}>;`,
    ...(pk ? [] : [`var<workgroup> p_s: array<f16, ${nsg * M * PSTR}>;`]),
    ...(v.step === 5 ? pageFn(N * D) : []),
    `@compute @workgroup_size(${nsg * d.sg})`,
    "@diagnostic(off, chromium.subgroup_matrix_uniformity)",
    "fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,",
    "        @builtin(local_invocation_index) t: u32,",
    "        @builtin(subgroup_invocation_id) lane: u32) {",
    `  let sr = sg * ${M}u;`,
    `  let r0 = wg.x * ${nsg * M}u;`,
    `  let sp = sg * ${M * SSTR}u; // this subgroup's S`,
    `  let pp = sg * ${M * PSTR}u; // and P`,
    ...U.map((u) =>
      `  let a_${u} = subgroupMatrixLoad<${L}, row_major>(&a, (r0 + sr) * ${D}u + ${
        u * d.k
      }u, ${D}u);`
    ),
    ...J.map((j) => `  var o_${j} = ${Res}();`),
    ...RPL.map((i) => `  var l_${i} = 0.0;`),
    ...held.before.map((x) => "  " + x),
    // -xd / -xg: counts the compiler cannot see (arrayLength(&b4) is far above both).
    ...(v.kernelForms ? [`  let nsteps = min(${steps}u, arrayLength(&b4));`] : []),
    ...(v.kernelForms ? [`  let nkeys = min(${N}u, arrayLength(&b4));`] : []),
    ...(v.kernelForms.includes("d")
      ? loopBody.map((x) => x.replaceAll(`< ${steps}u`, "< nsteps"))
      : loopBody).flatMap((x) =>
        pk && x.includes("let bb = ")
          ? [x, `  let bk = (it % 2u) * ${KT}u;`]
          : pk && x.includes("(&bs_s, bb + ")
          ? [x.replace("(&bs_s, bb + ", "(&bs_s, bk + ")]
          : [x]
      ).flatMap((x) => [
        "  " + x,
        ...(x.startsWith("for (var it") ? held.inLoop.map((y) => "    " + y) : []),
      ]),
    ...held.after.map((x) => "  " + x),
    ...J.map((j) =>
      `  subgroupMatrixStore<row_major>(&c, (r0 + sr) * ${ldc}u + ${j * d.n}u, o_${j}, ${ldc}u);`
    ),
    ...RPL.flatMap((i) => [
      ...range(Math.log2(ln.lpr)).map((b) => `  l_${i} += subgroupShuffleXor(l_${i}, ${1 << b}u);`),
      `  if (lane % ${ln.lpr}u == 0u && lane < ${ln.lpr * M}u) {`,
      `    c[${s.m * ldc}u + r0 + sr + ${rowOf(i)}] = l_${i};`,
      "  }",
    ]),
    "}",
  ];
  return out.join("\n");
}

/**
 * `-h{N}`: N f32 values from Q held across the loop: loaded before it, updated in the loop only
 * when `never` holds (no workgroup id does), written after it only then (c[0]).
 */
function holdCode(H: number[], never: string) {
  if (!H.length) return { before: [], inLoop: [], after: [] };
  return {
    before: H.map((h) => `var h${h} = f32(a[wg.x * 7u + ${h}u]);`),
    inLoop: [`if (it == ${never}) {`, ...H.map((h) => `  h${h} = h${h} * 1.5 + f32(it);`), "}"],
    after: [`if (0u == ${never}) {`, `  c[0] = ${sumTree(H.map((h) => `h${h}`))};`, "}"],
  };
}

/** `max(...)` of the names as a balanced tree. */
function maxTree(xs: string[]): string {
  if (xs.length === 1) return xs[0];
  const h = xs.length >> 1;
  return `max(${maxTree(xs.slice(0, h))}, ${maxTree(xs.slice(h))})`;
}

/** The sum of the names as a balanced tree. */
function sumTree(xs: string[]): string {
  if (xs.length === 1) return xs[0];
  const h = xs.length >> 1;
  return `(${sumTree(xs.slice(0, h))} + ${sumTree(xs.slice(h))})`;
}
