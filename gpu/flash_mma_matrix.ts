/**
 * The unrolled matrix code of the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`) for one
 * variant ({@link generateMatrixCode}): the Q fragments, S = Q K^T and O += P V, with K and V
 * from the staged tiles or, `direct`, from the f16 cache (the request's last V tile from a
 * zero-padded copy: {@link TAIL_STAGE}); the O passes through workgroup memory come from
 * gpu/flash_mma_opass.ts.
 * @module
 */
import { type MmaConsts, strideArg } from "./flash_mma_shape.ts";
import { type MatrixFrame, matrixFrame } from "./flash_mma_frame.ts";
import { oPassCode } from "./flash_mma_opass.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * Direct loads: a V tile PV reads from workgroup memory instead of the cache (TAIL_STAGE): the
 * request's last, and those gpu/flash_mma_specials.ts cleans (`tile_cleaned` says both).
 */
const V_COPIED = "tile_cleaned(kt, kv_len, p_first, p_last)";

/**
 * Direct loads: the request's last, partial tile of V, zero past kv_len, into the P buffer the
 * tile does not use (two barriers before its PV reads it): p = 0 does not cancel a NaN or an
 * infinity that a cache slot past the request may hold. So for a tile not every row sees whole,
 * with its infinities and NaNs as 0 (gpu/flash_mma_specials.ts).
 */
export const TAIL_STAGE = `    if (${V_COPIED}) {
      let vtb = (par ^ 1u) * KT_LEN;
      for (var idx = t; idx < BK * D; idx += WG) {
        let key = kt + idx / D;
        var x = f16(0.0);
        if (key < kv_len) {
          x = v_finite1(v0[kv_elem(key, kvh, kv_len, rbase) + idx % D]);
        }
        kt_s[vtb + (idx / D) * KSTR + idx % D] = x;
      }
    }`;

/** The unrolled matrix fragments of flash_mma.wgsl for one kernel. */
export function generateMatrixCode(c: MmaConsts): Record<string, string> {
  const fr = matrixFrame(c);
  const { m, k, kstr, dqp, RM, KD, DN, L, Res } = fr;
  const ind = (s: string[], pad: string) => s.map((x) => pad + x).join("\n");
  const qDecl = RM.flatMap((r) => KD.map((c) => `var q_${r}_${c}: ${L};`));
  // Q fragment (r, c) from the staged rows at `base` (the pass's `qb + `, or "" for `qpass`).
  const qFrag = (r: number, c: number, base: string) =>
    `subgroupMatrixLoad<${L}, row_major>(&kt_s, ${base}${dqp}${r * m * kstr + c * k}u, ${
      strideArg("q", "kstr")
    })`;
  const qLoad = RM.flatMap((r) => KD.map((c) => `q_${r}_${c} = ${qFrag(r, c, "qb + ")};`));
  const oDecl = RM.flatMap((r) => DN.map((c) => `var o_${r}_${c} = ${Res}();`));
  const qk = qkCode(c, fr);
  const pv = pvCode(fr);
  const { rescale, mine, output, sink } = oPassCode(c, fr);
  return {
    QFRAG_DECL: ind(qDecl, "  "),
    QFRAG_LOAD: ind(qLoad, "      "),
    // `qpass` ablation: the fragments as `let`s loaded once, unconditionally (wrong data).
    QFRAG_LET: ind(RM.flatMap((r) => KD.map((c) => `let q_${r}_${c} = ${qFrag(r, c, "")};`)), "  "),
    O_DECL: ind(oDecl, "  "),
    QK: ind(qk, "      "),
    PV: ind(pv, "      "),
    O_RESCALE: ind(rescale, "      "),
    O_RESCALE_MINE: ind(mine, "      "),
    O_OUTPUT: ind(output, "  "),
    O_SINK: ind(sink, "  "),
  };
}

/** S = Q K^T of one tile: the S chains' fragments, their multiply-accumulates and stores. */
function qkCode(c: MmaConsts, fr: MatrixFrame): string[] {
  const { m, n, k, direct, kstr, dqp, srow, RM, KD, NB, Rt, Res, mma } = fr;
  // S = Q K^T: QS independent chains per (row block, key block); chain j takes k-steps
  // j, j + QS, ... and is stored to its own S array (at j * R * SSTR), the softmax adds them.
  const QS = range(c.qsplit), sv = (r: number, c: number, j: number) => `s_${r}_${c}_${j}`;
  const qk = RM.flatMap((r) => NB.flatMap((c) => QS.map((j) => `var ${sv(r, c, j)} = ${Res}();`)));
  // direct: fragment (keys kt + c n.., dims kk k..) at kv_elem(key) + kk k, keys KVSTR apart.
  const kAt = (c: number, kk: number) =>
    direct
      ? `&k0, ko${c} + ${kk * k}u, kvstr`
      : `&kt_s, kb + ${dqp}${c * n * kstr + kk * k}u, ${strideArg("k", "kstr")}`;
  if (direct) {
    qk.push(...NB.map((c) => `let ko${c} = kv_elem(kt + ${c * n}u, kvh, kv_len, rbase);`));
  }
  // k-step outer, key block inner: the NB x QS chains advance together.
  for (const kk of KD) {
    for (const c of NB) {
      const j = kk % QS.length;
      qk.push(`{`);
      qk.push(`  let kf = subgroupMatrixLoad<${Rt}, col_major>(${kAt(c, kk)});`);
      for (const r of RM) qk.push(`  ${sv(r, c, j)} = ${mma}(q_${r}_${kk}, kf, ${sv(r, c, j)});`);
      qk.push(`}`);
    }
  }
  for (const r of RM) {
    for (const c of NB) {
      for (const j of QS) {
        qk.push(
          `subgroupMatrixStore<row_major>(&s_s, ${j ? `${j}u * R * SSTR + ` : ""}(${srow} + ${
            r * m
          }u) * SSTR + ${c * n}u, ${sv(r, c, j)}, ${strideArg("s", "sstr")});`,
        );
      }
    }
  }
  return qk;
}

/** O += P V of one tile: the P fragments, then V's from the staged tile or the cache. */
function pvCode(fr: MatrixFrame): string[] {
  const { m, n, k, direct, kstr, dqp, RM, KB, DN, L, Rt, mma } = fr;
  const pv = RM.flatMap((r) =>
    KB.map((kk) =>
      `let p_${r}_${kk} = subgroupMatrixLoad<${L}, row_major>(&kt_s, kb + (sgr + ${
        r * m
      }u) * PSTR + ${kk * k}u, ${strideArg("p", "pstr")});`
    )
  );
  // V fragment (keys kk k.., dims c n..): the staged tile, the cache (direct), or for the
  // request's last, partial tile under direct loads the zero-padded copy in kt_s (TAIL_STAGE).
  const staged = (kk: number, c: number) =>
    `&vt_s, vb + ${dqp}${kk * k * kstr + c * n}u, ${strideArg("v", "kstr")}`;
  const cached = (kk: number, c: number) => `&v0, vo${kk} + ${c * n}u, kvstr`;
  const tail = (kk: number, c: number) =>
    `&kt_s, vtb + ${kk * k * kstr + c * n}u, ${strideArg("v", "kstr")}`;
  const pvFrom = (at: (kk: number, c: number) => string, pad: string) =>
    DN.flatMap((c) =>
      KB.flatMap((kk) => [
        `{`,
        `  let vf = subgroupMatrixLoad<${Rt}, row_major>(${at(kk, c)});`,
        ...RM.map((r) => `  o_${r}_${c} = ${mma}(p_${r}_${kk}, vf, o_${r}_${c});`),
        `}`,
      ])
    ).map((x) => pad + x);
  if (!direct) pv.push(...pvFrom(staged, ""));
  else {
    pv.push(`if (${V_COPIED}) {`, "  let vtb = (par ^ 1u) * KT_LEN;");
    pv.push(...pvFrom(tail, "  "), "} else {");
    pv.push(...KB.map((kk) => `  let vo${kk} = kv_elem(kt + ${kk * k}u, kvh, kv_len, rbase);`));
    pv.push(...pvFrom(cached, "  "), "}");
  }
  return pv;
}
