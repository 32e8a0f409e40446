/**
 * The softmax step of the subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl), unrolled for
 * one lane: its RPL rows, KPL scores each, read from S; the row max over the LPR lanes of a row;
 * the lazy rescale; p as f16 into P; the workgroup's rescale flag. Two forms:
 * - {@link softmaxCode}: every feature tested at run time (`score` of flash_mma_rows.wgsl),
 *   every key masked, natural exp;
 * - {@link fastSoftmaxCode}: only the batch's features (compile time), no mask on interior
 *   tiles (every key visible to every row of the subgroup), exp2 with log2(e) folded into the
 *   scale (the kernel keeps m, slopes and sinks in log2 units: LG; the LSE is converted back).
 * @module
 */
import { type MmaConsts, mmaLayout } from "./flash_mma_shape.ts";
import { nanKeepingCap } from "./wgsl.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * The raw score of this lane's key `e` in S: with `qsplit` chains, the sum of their partial
 * products (chain j's S at j * R * SSTR).
 */
function scoreAt(c: MmaConsts, e: number): string {
  const parts = range(c.qsplit * c.dsplit).map((j) =>
    `s_s[sb + ${j ? `${j}u * R * SSTR + ` : ""}${e}u]`
  );
  return parts.length > 1 ? `(${parts.join(" + ")})` : parts[0];
}

/** `max(...)` of the names as a balanced tree. */
function maxTree(xs: string[]): string {
  if (xs.length === 1) return xs[0];
  const h = xs.length / 2;
  return `max(${maxTree(xs.slice(0, h))}, ${maxTree(xs.slice(h))})`;
}

/** The shared tail of a row: row max, lazy rescale, p into P, running sum. */
function rowTail(
  c: MmaConsts,
  i: number,
  E: number[],
  pOf: (e: number) => string,
  exp: string,
): string[] {
  const p = "kt_s[kb + pb + "; // P over this tile's dead K
  // dsplit: both subgroups of a pair run the softmax (each needs the rows' state), the first
  // writes P.
  const pStores = c.dsplit > 1
    ? [
      ...E.map((e) => `  let p${e} = ${pOf(e)};`),
      "  if (dh == 0u) {",
      ...E.map((e) => `    ${p}${e}u] = p${e};`),
      "  }",
    ]
    : E.map((e) => `  let p${e} = ${pOf(e)};\n  ${p}${e}u] = p${e};`);
  return [
    `  var tmax = ${maxTree(E.map((e) => `x${e}`))};`,
    "  for (var o = 1u; o < LPR; o <<= 1u) {",
    "    tmax = max(tmax, subgroupShuffleXor(tmax, o));",
    "  }",
    `  if (tmax > m[${i}] + TAUL) {`,
    `    alpha[${i}] = ${exp}(m[${i}] - tmax);`,
    `    l[${i}] *= alpha[${i}];`,
    `    m[${i}] = tmax;`,
    `    flag = flag || seen[${i}];`,
    "  }",
    ...pStores,
    `  l[${i}] += ${E.map((e) => `f32(p${e})`).join(" + ")};`,
    `  seen[${i}] = seen[${i}] || tmax > MASK;`,
  ];
}

const rowHead = (i: number, sg: number, lpr: number) => [
  `  let rl = ln / LPR + ${i * (sg / lpr)}u;`,
  "  let sb = (sgr + rl) * SSTR + lq * KPL;",
  "  let pb = (sgr + rl) * PSTR + lq * KPL;",
  "  let key0 = kt + lq * KPL;",
];

/**
 * The rows' rescale flag out of the step: the workgroup's atomic, a bit of it (`stagger`), or
 * (`sgresc`) the lane's.
 */
const flagCode = (c: MmaConsts) =>
  c.sgresc ? ["resc_lane = flag;"] : c.stagger // a bit of the word for this half and tile (`flag_bit`, gpu/flash_mma_loop.ts)
    ? ["if (flag) {", "  atomicOr(&s_u[2], flag_bit);", "}"]
    : ["if (flag) {", "  atomicStore(&s_u[2], 1u);", "}"];

const indent = (out: string[]) =>
  out.map((x) => x.split("\n").map((y) => "      " + y).join("\n")).join("\n");

/** The generic softmax: run-time features, every key masked (`score`), natural exp. */
export function softmaxCode(c: MmaConsts): string {
  const lay = mmaLayout(c, c), E = range(c.bk / lay.lpr);
  const out = ["var flag = false;"];
  for (const i of range(lay.rpl)) {
    out.push(
      "{",
      ...rowHead(i, c.sg, lay.lpr),
      ...E.map((e) => {
        const score = `score(${scoreAt(c, e)}, rpos[${i}], rslope[${i}], key0 + ${e}u, kend)`;
        return `  let x${e} = select(MASK, ${score}, rok[${i}]);`;
      }),
      // p = 0 where x <= MASK (a masked key; m may still be MASK). `x > MASK` was false for a
      // NaN score too and made its p 0, dropping a NaN read from the cache: float64 gives NaN.
      ...rowTail(c, i, E, (e) => `f16(select(exp(x${e} - m[${i}]), 0.0, x${e} <= MASK))`, "exp"),
      "}",
    );
  }
  out.push(...flagCode(c));
  return indent(out);
}

/** Whether every key of the tile is visible to every row of the subgroup (WGSL, uniform). */
function interiorTest(c: MmaConsts): string {
  const t = ["kt + BK <= kend"];
  if (c.causal) {
    t.push("i32(kt + BK) - 1 <= p_lo");
    if (c.window) t.push("p_hi - i32(kt) < w");
  } else if (c.window) t.push("p_hi - i32(kt) < w", "i32(kt + BK) - 1 - p_lo < w");
  return t.join(" && ");
}

/** Whether key `k0 + e` (dk = pos - key) is visible: the mask of a boundary tile (WGSL). */
function visibleTest(c: MmaConsts, e: number): string {
  const t = [`key0 + ${e}u < kend`];
  if (c.causal) {
    t.push(`dk0 >= ${e}`);
    if (c.window) t.push(`dk0 - ${e} < w`);
  } else if (c.window) t.push(`abs(dk0 - ${e}) < w`);
  return t.join(" && ");
}

/**
 * The specialized softmax: scores in log2 units (scale * log2 e, the soft cap's tanh taken in
 * natural units first, ALiBi slopes pre-multiplied by log2 e in the row set-up), masks only on
 * tiles some row of the subgroup does not fully see, exp2. Masked scores are MASK and the
 * running max starts at M0 (-1e30, or the sink) above it, so p = exp2(x - m) is 0 for them
 * without a select.
 */
export function fastSoftmaxCode(c: MmaConsts): string {
  const lay = mmaLayout(c, c), E = range(c.bk / lay.lpr);
  const scale = c.softcap ? "U.scale_qk / U.softcap" : "U.scale_qk * LOG2E";
  // Non-causal without a window masks only keys past kend: every tile takes the selects,
  // no `inner` branch. (The branch's one test, kt + BK <= kend, against the loop's own bound
  // is the one thing that set the test case that never finished compiling on the H200 apart
  // from those that compiled in ~1 s; see bench/NOTES.md, v0.6.)
  const kendOnly = !c.causal && !c.window;
  const out = [
    "var flag = false;",
    `let sc = ${scale};`,
    ...(c.softcap ? ["let capl = U.softcap * LOG2E;"] : []),
    ...(kendOnly ? [] : [`let inner = ${interiorTest(c)};`]),
  ];
  const usesDk = c.causal || c.window || c.alibi;
  for (const i of range(lay.rpl)) {
    out.push("{", ...rowHead(i, c.sg, lay.lpr));
    if (usesDk) out.push(`  let dk0 = rpos[${i}] - i32(key0);`);
    for (const e of E) {
      out.push(`  var x${e} = ${scoreAt(c, e)} * sc;`);
      if (c.softcap) out.push(`  x${e} = ${nanKeepingCap(`x${e}`, "capl", "")};`);
      if (c.alibi) out.push(`  x${e} -= rslope[${i}] * f32(dk0 - ${e});`);
    }
    const pad = kendOnly ? "  " : "    ";
    if (!kendOnly) out.push("  if (!inner) {");
    for (const e of E) out.push(`${pad}x${e} = select(MASK, x${e}, ${visibleTest(c, e)});`);
    if (!kendOnly) out.push("  }");
    out.push(...rowTail(c, i, E, (e) => `f16(exp2(x${e} - m[${i}]))`, "exp2"), "}");
  }
  out.push(...flagCode(c));
  return indent(out);
}
