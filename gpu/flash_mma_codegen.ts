/**
 * WGSL generator for the subgroup-matrix prefill kernel (`wgsl/flash_mma.wgsl`): the
 * straight-line matrix code unrolled for one variant (Q fragments, S = Q K^T, O += P V, with K
 * and V from the staged tiles or, `direct`, from the f16 cache; the O passes through workgroup
 * memory for rescaling and output), and the whole source with every placeholder filled
 * ({@link flashMmaSource}), a bench ablation leaving its stage out. Shapes live in
 * gpu/flash_mma_shape.ts, the layout in gpu/flash_mma_layout.ts, the softmax in
 * gpu/flash_mma_softmax.ts, K/V staging and decoders in gpu/flash_mma_staging.ts.
 * @module
 */
import {
  ablatedStages,
  type MmaConsts,
  mmaLayout,
  mmaShapeProblem,
  strideArg,
} from "./flash_mma_shape.ts";
import { fastSoftmaxCode, softmaxCode } from "./flash_mma_softmax.ts";
import { roundCode, sourceCode, stagingCode, stagingDecoders } from "./flash_mma_staging.ts";
import { valueCleanCode, valueSpecialFns, valueSpecialsCode } from "./flash_mma_specials.ts";
import { mmaLoopCode, type MmaLoopParts } from "./flash_mma_loop.ts";
import { loadWgsl, specialize, TANH_REL_FN } from "./wgsl.ts";
import { envVar } from "../core/env.ts";

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
const TAIL_STAGE = `    if (${V_COPIED}) {
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
  const { m, n, k, d, bk, direct } = c, shape = c;
  const kstr = d + 8, ds = c.dsplit;
  // dsplit: this subgroup's half of D (columns dq..) and its own S / O rows of s_s (chain dh).
  const dqp = ds > 1 ? "dq + " : "", srow = ds > 1 ? "sgr + dh * R" : "sgr";
  const RM = range(shape.rm), KD = range(d / k / ds), NB = range(bk / n), KB = range(bk / k);
  const DN = range(d / n / ds);
  const L = `subgroup_matrix_left<f16, MK, MM>`, Rt = `subgroup_matrix_right<f16, MN, MK>`;
  const Res = `subgroup_matrix_result<f32, MN, MM>`;
  const mma = "subgroupMatrixMultiplyAccumulate";
  const ind = (s: string[], pad: string) => s.map((x) => pad + x).join("\n");
  const qDecl = RM.flatMap((r) => KD.map((c) => `var q_${r}_${c}: ${L};`));
  // Q fragment (r, c) from the staged rows at `base` (the pass's `qb + `, or "" for `qpass`).
  const qFrag = (r: number, c: number, base: string) =>
    `subgroupMatrixLoad<${L}, row_major>(&kt_s, ${base}${dqp}${r * m * kstr + c * k}u, ${
      strideArg("q", "kstr")
    })`;
  const qLoad = RM.flatMap((r) => KD.map((c) => `q_${r}_${c} = ${qFrag(r, c, "qb + ")};`));
  const oDecl = RM.flatMap((r) => DN.map((c) => `var o_${r}_${c} = ${Res}();`));
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
  // O passes: columns [c0, c0 + w) through s_s, rows `str` floats apart from `base`: the
  // rescale's (w = bk, SSTR) and the epilogue's (w = ocols, OSTR, region base).
  const passesOf = (w: number, str: string, base: (p: number) => string) =>
    range(Math.ceil(d / ds / w)).map((p) => {
      const c0 = p * w;
      const frags = RM.flatMap((r) =>
        DN.filter((c) => c * n >= c0 && c * n < c0 + w).map((c) => ({
          name: `o_${r}_${c}`,
          at: `${base(p)}(${srow} + ${r * m}u) * ${str} + ${c * n - c0}u`,
        }))
      );
      return { c0, frags };
    });
  const passes = passesOf(bk, "SSTR", () => "");
  const regions = c.oregions;
  const region = (p: number) => (p % regions ? `${p % regions}u * R * OSTR` : ""); // pass p's
  const outPasses = passesOf(c.ocols, "OSTR", (p) => (region(p) ? `${region(p)} + ` : ""));
  // The epilogue's stride: SSTR's run-time word only where OSTR is SSTR (the stride probe).
  const oStride = c.ocols === bk ? strideArg("o", "sstr") : "OSTR";
  const store = (fs: { name: string; at: string }[], stride = strideArg("o", "sstr")) =>
    fs.map((f) => `subgroupMatrixStore<row_major>(&s_s, ${f.at}, ${f.name}, ${stride});`);
  const rescale: string[] = [], output: string[] = [], sink: string[] = [];
  const loadBack = (f: { name: string; at: string }) =>
    `${f.name} = subgroupMatrixLoad<${Res}, row_major>(&s_s, ${f.at}, ${strideArg("o", "sstr")});`;
  // sgresc: the subgroup's own rows only, no workgroup barrier (see RESC_APPLY).
  const bar = c.sgresc ? [] : ["workgroupBarrier();"];
  passes.forEach(({ frags }) => {
    rescale.push(...store(frags), ...bar, `scale_rows(${srow}, ln, alpha);`);
    rescale.push(...bar);
    rescale.push(...frags.map(loadBack));
    rescale.push(...bar);
  });
  // stagger: only the subgroups of the half that asked (`mine`), the second half's rows `rsh`
  // past its S rows (which still hold a tile's scores then).
  const mine: string[] = [];
  const guard = (xs: string[]) => ["if (mine) {", ...xs.map((x) => "  " + x), "}"];
  if (c.stagger) {
    passesOf(bk, "SSTR", () => "rsh * SSTR + ").forEach(({ frags }) => {
      mine.push(...guard(store(frags)), "workgroupBarrier();");
      mine.push(...guard([`scale_rows(${srow} + rsh, ln, alpha);`]), "workgroupBarrier();");
      mine.push(...guard(frags.map(loadBack)), "workgroupBarrier();");
    });
  }
  // With one region a pass's writes must finish before the next pass's stores (a barrier);
  // with two, pass p stores where pass p - 2 was read, before pass p - 1's barrier.
  outPasses.forEach(({ c0, frags }, i) => {
    output.push(
      ...store(frags, oStride),
      "workgroupBarrier();",
      `write_rows(${srow}, ln, ${dqp}${c0}u, tb, inv, ${region(i) || "0u"});`,
    );
    if (regions === 1 && i < outPasses.length - 1) output.push("workgroupBarrier();");
    sink.push(...store(frags, oStride));
  });
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

/**
 * The lazy rescale's protocol around O_RESCALE: by default the workgroup's atomic flag
 * (cleared at the top of a tile, read by workgroupUniformLoad before PV); `sgresc`: the lanes'
 * flags (`resc_lane`, set by the softmax) and the subgroup's own decision after a plain barrier.
 */
function rescaleProtocol(
  c: MmaConsts,
  rescale: string,
): { RESC_RESET: string; RESC_APPLY: string } {
  if (!c.sgresc) {
    return {
      RESC_RESET: "    if (t == 0u) {\n      atomicStore(&s_u[2], 0u);\n    }",
      RESC_APPLY:
        `    let resc = workgroupUniformLoad(&s_u[2]);\n    if (resc != 0u) {\n${rescale}\n    }`,
    };
  }
  return {
    RESC_RESET: "    var resc_lane = false; // this lane's rows need an O rescale this tile",
    RESC_APPLY: [
      "    workgroupBarrier(); // P (and the softmax's reads of S) before PV",
      "    if (subgroupAny(resc_lane)) {",
      rescale,
      "    }",
    ].join("\n"),
  };
}

const LIVE = "live_rows && tile_live(kt, p_lo, p_hi)";

/**
 * write_rows: this lane's part of its rows of the epilogue O pass at s_s[base..] (columns c0..,
 * rows OSTR apart), normalised by `inv` and written as data-dtype bits: a 4-byte store per 2
 * elements, or with `ovec` one 16-byte store per 8 (`out` is then `array<vec4<u32>>`; a row's
 * element offset and a lane's columns are multiples of 8, so every store is whole and aligned).
 * `sink` (the bench's `write` ablation, wrong results): the words are folded into one value a
 * lane and stored only if it equals a constant, so the rounding stays and the stores go.
 */
export function writeRowsCode(c: { ovec: boolean; sink?: boolean }): string {
  const head = [
    "fn write_rows(sgr: u32, ln: u32, c0: u32, tb: array<u32, RPL>, inv: array<f32, RPL>, base: u32) {",
    ...(c.sink ? ["  var sink = 0u;"] : []),
    "  for (var i = 0u; i < RPL; i++) {",
    "    let b = base + (sgr + ln / LPR + i * (SG / LPR)) * OSTR + (ln % LPR) * OKPL;",
    "    let col = c0 + (ln % LPR) * OKPL;",
  ];
  const pair = (e: string) => `round_pair(s_s[b + ${e}] * inv[i], s_s[b + ${e} + 1u] * inv[i])`;
  const put = (at: string, v: string) => (c.sink ? `sink ^= ${v};` : `out[${at}] = ${v};`);
  const body = c.ovec
    ? [
      "    for (var e = 0u; e < OKPL; e += 8u) {",
      "      if (tb[i] != 0xffffffffu) {",
      c.sink
        ? `        sink ^= ${pair("e")} ^ ${pair("e + 2u")} ^ ${pair("e + 4u")} ^ ${
          pair("e + 6u")
        };`
        : `        out[(tb[i] + col + e) / 8u] = vec4<u32>(${pair("e")}, ${pair("e + 2u")},`,
      ...(c.sink ? [] : [`          ${pair("e + 4u")}, ${pair("e + 6u")});`]),
      "      }",
      "    }",
    ]
    : [
      "    for (var e = 0u; e < OKPL; e += 2u) {",
      "      if (tb[i] != 0xffffffffu && col + e < D) {",
      `        ${put("(tb[i] + col + e) / 2u", pair("e"))}`,
      "      }",
      "    }",
    ];
  const tail = c.sink
    ? [
      "  }",
      "  if (sink == 0x9e3779b9u) {",
      `    out[0] = ${c.ovec ? "vec4<u32>(sink)" : "sink"};`,
      "  }",
      "}",
    ]
    : ["  }", "}"];
  return [...head, ...body, ...tail].join("\n");
}

/** The `count` ablation's default trip count: the `1x4224n-h4k1` bench case's tiles. */
const ABLATED_TILES = 264;

/** The `count` ablation's trip count (bench only): ATTN_MMA_ABLATE_TILES, else the default. */
function ablatedTiles(): number {
  const v = Number(envVar("ATTN_MMA_ABLATE_TILES") ?? ABLATED_TILES);
  return Number.isInteger(v) && v > 0 ? v : ABLATED_TILES;
}

/** The kernel source after the generated header (gpu/kernel.ts adds enables and bindings). */
export async function flashMmaSource(c: MmaConsts): Promise<string> {
  const problem = mmaShapeProblem(c, c);
  if (problem) throw new Error(`flash_mma: ${problem}`);
  const lay = mmaLayout(c, c);
  const matrix = generateMatrixCode(c), staging = stagingCode(c);
  const cuts = ablatedStages(c);
  const cut = (stage: string) => cuts.has(stage);
  const loop: MmaLoopParts = {
    TAIL_STAGE: c.direct && !cut("pv") ? TAIL_STAGE : "",
    LIVE: cut("live") ? "true" : LIVE,
    ...(cut("rescale") ? { RESC_RESET: "", RESC_APPLY: "" } : rescaleProtocol(c, matrix.O_RESCALE)),
    O_RESCALE: cut("rescale") ? "" : matrix.O_RESCALE,
    O_RESCALE_MINE: matrix.O_RESCALE_MINE,
    STAGE_STORE: cut("stage") ? "" : staging.STAGE_STORE,
    SOFTMAX: cut("softmax") ? "" : c.fast ? fastSoftmaxCode(c) : softmaxCode(c),
    LOOP_STAGE_LOAD: cut("stage") ? "" : staging.STAGE_LOAD,
    LOOP_HEAD: cut("count")
      ? `for (var it = 0u; it < ${ablatedTiles()}u; it++) {\n    let kt = kstart + it * BK;`
      : "for (var kt = kstart; kt < kend; kt += BK) {",
    V_CLEAN: cut("specials") ? "" : valueCleanCode(c),
    QK: cut("qk") ? "" : matrix.QK,
    PV: cut("pv") ? "" : matrix.PV,
  };
  return specialize(await loadWgsl("flash_mma.wgsl"), {
    TANH_REL: TANH_REL_FN,
    HELPERS: await loadWgsl("flash_mma_rows.wgsl"),
    WRITE_ROWS: writeRowsCode({ ovec: c.ovec, sink: cut("write") }),
    TILE: await loadWgsl("flash_tile.wgsl"),
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
    LG: c.fast ? Math.LOG2E : 1,
    M0: c.fast ? "-1.0e30" : "MASK",
    QSPLIT: c.qsplit * c.dsplit, // S arrays: a chain's, or a D half's
    R_DIV: c.dsplit > 1 ? ` / ${c.dsplit}u` : "",
    SG_ROWS: c.dsplit > 1
      ? [
        `  let sgr = (sg / ${c.dsplit}u) * MR; // dsplit subgroups a row block`,
        `  let dh = sg % ${c.dsplit}u; // which part of D`,
        `  let dq = dh * (D / ${c.dsplit}u);`,
      ].join("\n")
      : "  let sgr = sg * MR;",
    LSE_OWNER: c.dsplit > 1 ? " && dh == 0u" : "",
    VT_DECL: c.direct ? "" : `var<workgroup> vt_s: array<f16, ${lay.vtBufs}u * VT_LEN>;`,
    KT_DECL: c.stagger ? `${lay.ktDecl}u` : "2u * KT_LEN",
    E16: lay.e16,
    KT_LEN: lay.ktLen,
    KSTR: lay.kstr,
    SSTR: lay.sstr,
    OSTR: lay.ostr,
    OC: c.ocols,
    S_LEN: lay.sLen,
    PSTR: lay.pstr,
    QPASS: lay.qpass,
    LPR: lay.lpr,
    RPL: lay.rpl,
    DECODE: stagingDecoders(c.kv, c.dtype),
    SOURCE: sourceCode(c),
    ROUND: await roundCode(c.dtype, cut("round") ? "cut" : c.opack ? "pack" : "exact"),
    ...matrix,
    LOOP: mmaLoopCode(c, loop),
    STAGE_LOAD: staging.STAGE_LOAD,
    STAGE_STORE: staging.STAGE_STORE,
    // The epilogue's cut keeps O's stores (no barriers, no output writes): without a reader of O
    // the compiler drops PV with it (v0.9's `~norescale+epilogue` and `~nobare` timed no PV).
    O_OUTPUT: cut("epilogue") ? matrix.O_SINK : matrix.O_OUTPUT,
    V_SPECIAL_FNS: valueSpecialFns(c),
    V_SPECIALS: cut("epilogue") || cut("write") || cut("specials") ? "" : valueSpecialsCode(c),
    QFRAG_DECL: cut("qpass") ? matrix.QFRAG_LET : matrix.QFRAG_DECL,
    QFRAG_LOAD: cut("qpass") ? "" : matrix.QFRAG_LOAD,
  });
}
