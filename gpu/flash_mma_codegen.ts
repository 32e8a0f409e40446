/**
 * WGSL generator for the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`): the softmax
 * step and the straight-line matrix code unrolled for one variant (Q fragments, S = Q K^T,
 * O += P V, the O passes through workgroup memory for rescaling and output), and the whole
 * source with every placeholder filled ({@link flashMmaSource}). Shapes and layout live in
 * gpu/flash_mma_shape.ts, K/V staging and decoders in gpu/flash_mma_staging.ts.
 * @module
 */
import { type MmaConsts, mmaLayout, mmaShapeProblem } from "./flash_mma_shape.ts";
import { roundCode, sourceCode, stagingCode, stagingDecoders } from "./flash_mma_staging.ts";
import { loadWgsl, specialize } from "./wgsl.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * The softmax step of one lane, unrolled: for each of its RPL rows, KPL scores read from S,
 * capped, biased and masked (`score`), the row max over the LPR lanes, the lazy rescale, and
 * p = exp(s - m) as f16 into P; sets the workgroup's rescale flag when an accumulated row moved.
 */
export function softmaxCode(c: MmaConsts): string {
  const lay = mmaLayout(c, c), kpl = c.bk / lay.lpr, E = range(kpl);
  const out = ["var flag = false;"];
  for (const i of range(lay.rpl)) {
    const tree = (xs: string[]): string =>
      xs.length === 1
        ? xs[0]
        : `max(${tree(xs.slice(0, xs.length / 2))}, ${tree(xs.slice(xs.length / 2))})`;
    out.push(
      "{",
      `  let rl = ln / LPR + ${i * (c.sg / lay.lpr)}u;`,
      "  let sb = (sgr + rl) * SSTR + lq * KPL;",
      "  let pb = (sgr + rl) * PSTR + lq * KPL;",
      "  let k0 = kt + lq * KPL;",
      ...E.map((e) =>
        `  let x${e} = select(MASK, score(s_s[sb + ${e}u], rpos[${i}], rslope[${i}], k0 + ${e}u, kend), rok[${i}]);`
      ),
      `  var tmax = ${tree(E.map((e) => `x${e}`))};`,
      "  for (var o = 1u; o < LPR; o <<= 1u) {",
      "    tmax = max(tmax, subgroupShuffleXor(tmax, o));",
      "  }",
      `  if (tmax > m[${i}] + TAU) {`,
      `    alpha[${i}] = exp(m[${i}] - tmax);`,
      `    l[${i}] *= alpha[${i}];`,
      `    m[${i}] = tmax;`,
      `    flag = flag || seen[${i}];`,
      "  }",
      ...E.map((e) =>
        `  let p${e} = f16(select(0.0, exp(x${e} - m[${i}]), x${e} > MASK));\n  kt_s[kb + pb + ${e}u] = p${e};`
      ),
      `  l[${i}] += ${E.map((e) => `f32(p${e})`).join(" + ")};`,
      `  seen[${i}] = seen[${i}] || tmax > MASK;`,
      "}",
    );
  }
  out.push("if (flag) {", "  atomicStore(&s_resc, 1u);", "}");
  return out.map((x) => x.split("\n").map((y) => "      " + y).join("\n")).join("\n");
}

/** The unrolled matrix fragments of flash_mma.wgsl for one kernel. */
export function generateMatrixCode(c: MmaConsts): Record<string, string> {
  const { m, n, k, d, bk } = c, shape = c;
  const kstr = d + 8;
  const RM = range(shape.rm), KD = range(d / k), NB = range(bk / n), KB = range(bk / k);
  const DN = range(d / n);
  const L = `subgroup_matrix_left<f16, MK, MM>`, Rt = `subgroup_matrix_right<f16, MN, MK>`;
  const Res = `subgroup_matrix_result<f32, MN, MM>`;
  const mma = "subgroupMatrixMultiplyAccumulate";
  const ind = (s: string[], pad: string) => s.map((x) => pad + x).join("\n");
  const qDecl = RM.flatMap((r) => KD.map((c) => `var q_${r}_${c}: ${L};`));
  const qLoad = RM.flatMap((r) =>
    KD.map((c) =>
      `q_${r}_${c} = subgroupMatrixLoad<${L}, row_major>(&kt_s, qb + ${
        r * m * kstr + c * k
      }u, KSTR);`
    )
  );
  const oDecl = RM.flatMap((r) => DN.map((c) => `var o_${r}_${c} = ${Res}();`));
  const qk = RM.flatMap((r) => NB.map((c) => `var s_${r}_${c} = ${Res}();`));
  for (const c of NB) {
    for (const kk of KD) {
      qk.push(`{`);
      qk.push(
        `  let kf = subgroupMatrixLoad<${Rt}, col_major>(&kt_s, kb + ${
          c * n * kstr + kk * k
        }u, KSTR);`,
      );
      for (const r of RM) qk.push(`  s_${r}_${c} = ${mma}(q_${r}_${kk}, kf, s_${r}_${c});`);
      qk.push(`}`);
    }
  }
  for (const r of RM) {
    for (const c of NB) {
      qk.push(
        `subgroupMatrixStore<row_major>(&s_s, (sgr + ${r * m}u) * SSTR + ${
          c * n
        }u, s_${r}_${c}, SSTR);`,
      );
    }
  }
  const pv = RM.flatMap((r) =>
    KB.map((kk) =>
      `let p_${r}_${kk} = subgroupMatrixLoad<${L}, row_major>(&kt_s, kb + (sgr + ${
        r * m
      }u) * PSTR + ${kk * k}u, PSTR);`
    )
  );
  for (const c of DN) {
    for (const kk of KB) {
      pv.push(`{`);
      pv.push(
        `  let vf = subgroupMatrixLoad<${Rt}, row_major>(&vt_s, vb + ${
          kk * k * kstr + c * n
        }u, KSTR);`,
      );
      for (const r of RM) pv.push(`  o_${r}_${c} = ${mma}(p_${r}_${kk}, vf, o_${r}_${c});`);
      pv.push(`}`);
    }
  }
  // O passes: columns [c0, c0 + bk) through s_s.
  const passes = range(Math.ceil(d / bk)).map((p) => {
    const c0 = p * bk;
    const frags = RM.flatMap((r) =>
      DN.filter((c) => c * n >= c0 && c * n < c0 + bk).map((c) => ({
        name: `o_${r}_${c}`,
        at: `(sgr + ${r * m}u) * SSTR + ${c * n - c0}u`,
      }))
    );
    return { c0, frags };
  });
  const store = (fs: { name: string; at: string }[]) =>
    fs.map((f) => `subgroupMatrixStore<row_major>(&s_s, ${f.at}, ${f.name}, SSTR);`);
  const rescale: string[] = [], output: string[] = [];
  passes.forEach(({ c0, frags }, i) => {
    rescale.push(...store(frags), "workgroupBarrier();", "scale_rows(sgr, ln, alpha);");
    rescale.push("workgroupBarrier();");
    rescale.push(
      ...frags.map((f) =>
        `${f.name} = subgroupMatrixLoad<${Res}, row_major>(&s_s, ${f.at}, SSTR);`
      ),
    );
    rescale.push("workgroupBarrier();");
    output.push(...store(frags), "workgroupBarrier();", `write_rows(sgr, ln, ${c0}u, tb, inv);`);
    if (i < passes.length - 1) output.push("workgroupBarrier();");
  });
  return {
    QFRAG_DECL: ind(qDecl, "  "),
    QFRAG_LOAD: ind(qLoad, "      "),
    O_DECL: ind(oDecl, "  "),
    QK: ind(qk, "      "),
    PV: ind(pv, "      "),
    O_RESCALE: ind(rescale, "      "),
    O_OUTPUT: ind(output, "  "),
  };
}

/** The kernel source after the generated header (gpu/kernel.ts adds enables and bindings). */
export async function flashMmaSource(c: MmaConsts): Promise<string> {
  const problem = mmaShapeProblem(c, c);
  if (problem) throw new Error(`flash_mma: ${problem}`);
  const lay = mmaLayout(c, c);
  return specialize(await loadWgsl("flash_mma.wgsl"), {
    HELPERS: await loadWgsl("flash_mma_rows.wgsl"),
    MM: c.m,
    MN: c.n,
    MK: c.k,
    SG: c.sg,
    NSG: c.nsg,
    RM: c.rm,
    BK: c.bk,
    D: c.d,
    BS: c.bs,
    NHD: c.nhd,
    TAU: c.tau,
    E16: lay.e16,
    KT_LEN: lay.ktLen,
    QPASS: lay.qpass,
    LPR: lay.lpr,
    RPL: lay.rpl,
    NBT: lay.nbt,
    DECODE: stagingDecoders(c.kv, c.dtype),
    SOURCE: sourceCode(c),
    ROUND: await roundCode(c.dtype),
    SOFTMAX: softmaxCode(c),
    ...stagingCode(c),
    ...generateMatrixCode(c),
  });
}
