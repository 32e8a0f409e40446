/**
 * Transposed reductions over the LPK lanes of a split-kernel key group (gpu/decode_codegen.ts,
 * tunings `scatter_sums` and `scatter_softmax`), as straight-line WGSL over named variables:
 * - {@link halve}: reduce-scatter by recursive halving. At lane mask m a lane keeps the half of
 *   its block that its lane bit m selects and adds the partner's copy of that half (one shuffle
 *   per value kept), so that lane l ends with the sums of values (l >> r) * c .. + c - 1, where
 *   c = max(1, N / LPK) and r = log2(max(1, LPK / N)) (butterfly steps over the r low lane bits
 *   when N < LPK).
 * - {@link double}: all-gather by recursive doubling (one shuffle per value held).
 * - {@link transposedSums}: both: every lane ends with every sum; 2 (N - c) + c r shuffles
 *   instead of N log2(LPK) for a butterfly per value.
 * - {@link scatterSoftmax}: the online softmax of a step on the scattered scores: each lane
 *   takes the logit and exp of its own c scores only, the per-head maxima meet by a butterfly
 *   over the key bits and a gather over the head bits, then the probabilities are gathered for
 *   the value accumulation; each lane keeps the softmax denominator of its own scores, summed
 *   over the key group once, at the end ({@link scatterDenominators}).
 * All need `hb{m}` = (lane & m) != 0 for every mask m < LPK ({@link laneBits}); N, LPK, U
 * powers of two. With `indexed` the final all-gather is instead one subgroupShuffle per value
 * from the lane holding it ({@link gatherIndexed}: N shuffles and no selects, against N - c
 * shuffles and 2 (N - c) selects); it needs `sgb`, the subgroup invocation id of the key group's
 * first lane.
 * @module
 */

/** `hb{m}`: lane bit m of every mask below `lpk` (INIT). */
export const laneBits = (lpk: number): string[] => {
  const out: string[] = [];
  for (let m = 1; m < lpk; m *= 2) out.push(`  let hb${m} = (lane & ${m}u) != 0u;`);
  return out;
};

/** Where halving left the values: the block names each lane holds and the masks halved on. */
export interface Halved {
  block: string[];
  masks: number[];
}

/** Recursive halving of `vs` over `lpk` lanes into `out` (names `${tag}{level}_{j}`). */
export function halve(out: string[], vs: string[], lpk: number, tag: string): Halved {
  let block = vs.slice();
  const masks: number[] = [];
  for (let m = lpk / 2, t = 0; m >= 1; m /= 2, t++) {
    const next: string[] = [];
    if (block.length >= 2) {
      const h = block.length / 2;
      for (let j = 0; j < h; j++) {
        const lo = block[j], hi = block[j + h], name = `${tag}${t}_${j}`;
        out.push(
          `    let ${name} = select(${lo}, ${hi}, hb${m}) + ` +
            `subgroupShuffleXor(select(${hi}, ${lo}, hb${m}), ${m}u);`,
        );
        next.push(name);
      }
      masks.push(m);
    } else {
      const name = `${tag}${t}_0`;
      out.push(`    let ${name} = ${block[0]} + subgroupShuffleXor(${block[0]}, ${m}u);`);
      next.push(name);
    }
    block = next;
  }
  return { block, masks };
}

/** Recursive doubling of `block` over `masks` (ascending) into `out`; the gathered names. */
export function double(out: string[], block: string[], masks: number[], tag: string): string[] {
  masks.forEach((m, t) => {
    const recv = block.map((b, j) => {
      const name = `${tag}${t}_${j}`;
      out.push(`    let ${name} = subgroupShuffleXor(${b}, ${m}u);`);
      return name;
    });
    const lo = block.map((b, j) => `select(${b}, ${recv[j]}, hb${m})`);
    const hi = block.map((b, j) => `select(${recv[j]}, ${b}, hb${m})`);
    block = [...lo, ...hi].map((e, j) => {
      const name = `${tag}${t}_${block.length + j}`;
      out.push(`    let ${name} = ${e};`);
      return name;
    });
  });
  return block;
}

/**
 * All-gather of the `n` values that halving over `lpk` lanes left as `block` (value i in lane
 * (i / c) << r of the key group, name block[i % c]): one indexed shuffle per value.
 */
export function gatherIndexed(
  out: string[],
  block: string[],
  n: number,
  lpk: number,
  tag: string,
): string[] {
  const c = Math.max(1, n / lpk), r = Math.log2(Math.max(1, lpk / n));
  return Array.from({ length: n }, (_, i) => {
    const name = `${tag}${i}`;
    const from = Math.floor(i / c) * 2 ** r;
    out.push(`    let ${name} = subgroupShuffle(${block[i % c]}, sgb + ${from}u);`);
    return name;
  });
}

/** The gather after halving: indexed shuffles, or recursive doubling over the halved masks. */
const gatherAll = (out: string[], h: Halved, n: number, lpk: number, tag: string, ix: boolean) =>
  ix
    ? gatherIndexed(out, h.block, n, lpk, tag)
    : double(out, h.block, h.masks.slice().reverse(), tag);

/**
 * The sums over a key group's `lpk` lanes of the values `vs` (variable names, each lane's
 * partial), left in the same variables in every lane (see the module doc).
 */
export function transposedSums(vs: string[], lpk: number, indexed = false): string[] {
  const out: string[] = [];
  const h = halve(out, vs, lpk, "rs");
  const all = gatherAll(out, h, vs.length, lpk, "rg", indexed);
  vs.forEach((v, i) => out.push(`    ${v} = ${all[i]};`));
  return out;
}

/** How the N = F x U scores of a step (head-major: index f U + u) sit after halving. */
export interface ScatterLayout {
  /** Scores a lane holds, lanes holding the same ones (log2), scores of one head in a lane,
   * heads a lane holds. */
  c: number;
  r: number;
  ug: number;
  hpl: number;
  /** Lane masks over which a head's keys are spread (a max / sum over keys), and over which
   * the heads are (a gather of every head). */
  keyMasks: number[];
  headMasks: number[];
}

/** The layout of `f` heads x `u` keys over `lpk` lanes. */
export function scatterLayout(f: number, u: number, lpk: number): ScatterLayout {
  const n = f * u, c = Math.max(1, n / lpk), r = Math.log2(Math.max(1, lpk / n));
  const ug = Math.min(c, u), hpl = Math.max(1, c / u);
  const kb = Math.log2(u / ug);
  const masks = (from: number, to: number) =>
    Array.from({ length: Math.max(0, to - from) }, (_, i) => 2 ** (from + i));
  return {
    c,
    r,
    ug,
    hpl,
    keyMasks: masks(r, r + kb),
    headMasks: masks(r + kb, Math.log2(lpk)),
  };
}

/** INIT of {@link scatterSoftmax}: per held score its key `ou{j}`, per held head its slope
 * `so{g}` (ALiBi), running max `mo{g}` and denominator `lo{g}`. */
export function scatterInit(f: number, u: number, lpk: number, alibi: boolean): string[] {
  const L = scatterLayout(f, u, lpk), out = laneBits(lpk);
  const idx = (j: number) => `(lane >> ${L.r}u) * ${L.c}u + ${j}u`;
  for (let j = 0; j < L.c; j++) out.push(`  let ou${j} = (${idx(j)}) % ${u}u;`);
  for (let g = 0; g < L.hpl; g++) {
    const slope = alibi
      ? `bitcast<f32>(tab[P.slope_off + hq0 + (${idx(g * L.ug)}) / ${u}u])`
      : "0.0";
    out.push(`  let so${g} = ${slope};`, `  var mo${g} = NEG;`, `  var lo${g} = 0.0;`);
  }
  return out;
}

/**
 * One step's online softmax on the scores `s{u}_{f}` (lane partials, summed here): updates the
 * running maxima `m{f}` and rescales the accumulators `a{f}_{i}` (i < nv) of every head, and
 * defines `p{u}_{f}` in every lane for the value accumulation.
 */
export function scatterSoftmax(
  f: number,
  u: number,
  lpk: number,
  nv: number,
  indexed = false,
): string[] {
  const L = scatterLayout(f, u, lpk), out: string[] = [];
  const S: string[] = [];
  for (let h = 0; h < f; h++) for (let k = 0; k < u; k++) S.push(`s${k}_${h}`);
  const held = halve(out, S, lpk, "rs");
  const grp = (j: number) => Math.floor(j / L.ug);
  for (let j = 0; j < L.c; j++) {
    out.push(
      `    let vo${j} = k0 + ou${j} >= kt && k0 + ou${j} < ke;`,
      `    let ls${j} = logit(${held.block[j]}, k0 + ou${j}, vo${j}, pos, so${grp(j)});`,
    );
  }
  const top: string[] = [];
  for (let g = 0; g < L.hpl; g++) {
    const mine = Array.from({ length: L.ug }, (_, i) => `ls${g * L.ug + i}`);
    out.push(`    var mx${g} = ${mine.reduce((a, b) => `max(${a}, ${b})`)};`);
    for (const m of L.keyMasks) {
      out.push(`    mx${g} = max(mx${g}, subgroupShuffleXor(mx${g}, ${m}u));`);
    }
    out.push(`    let mg${g} = max(mo${g}, mx${g});`);
    top.push(`mg${g}`);
  }
  const heads = double(out, top, L.headMasks, "mh");
  heads.forEach((mf, h) => {
    out.push(`    if (${mf} > m${h}) {`, `      let al = exp(m${h} - ${mf});`);
    for (let i = 0; i < nv; i++) out.push(`      a${h}_${i} *= al;`);
    out.push(`      m${h} = ${mf};`, "    }");
  });
  for (let g = 0; g < L.hpl; g++) {
    out.push(
      `    if (mg${g} > mo${g}) {`,
      `      lo${g} *= exp(mo${g} - mg${g});`,
      `      mo${g} = mg${g};`,
      "    }",
    );
  }
  const po: string[] = [];
  for (let j = 0; j < L.c; j++) {
    out.push(`    let po${j} = select(0.0, exp(ls${j} - mo${grp(j)}), vo${j});`);
    po.push(`po${j}`);
  }
  for (let g = 0; g < L.hpl; g++) {
    out.push(`    lo${g} += ${po.slice(g * L.ug, (g + 1) * L.ug).join(" + ")};`);
  }
  const all = gatherAll(out, { block: po, masks: held.masks }, S.length, lpk, "pg", indexed);
  S.forEach((s, i) => out.push(`    let p${s.slice(1)} = ${all[i]};`));
  return out;
}

/** After the key loop: `l{f}` of every head from the lanes' own denominators `lo{g}`. */
export function scatterDenominators(f: number, u: number, lpk: number): string[] {
  const L = scatterLayout(f, u, lpk), out: string[] = [];
  const mine: string[] = [];
  for (let g = 0; g < L.hpl; g++) {
    out.push(`  var lt${g} = lo${g};`);
    for (const m of L.keyMasks) out.push(`  lt${g} += subgroupShuffleXor(lt${g}, ${m}u);`);
    mine.push(`lt${g}`);
  }
  const heads = double(out, mine, L.headMasks, "lh");
  heads.forEach((n, h) => out.push(`  l${h} = ${n};`));
  return out;
}
