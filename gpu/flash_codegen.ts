/**
 * WGSL generator for the register-tiled prefill kernel (wgsl/flash_attention.wgsl): the
 * straight-line fragments over one thread's register tile, unrolled for one compile-time
 * {@link FlashTile}. A thread (tx, ty) of the TX x TY grid owns query rows ty + TY * m
 * (m < RM) and, in the score step, keys tx + TX * n (n < RN) of the key tile; in the PV step
 * output vec4 columns tx + TX * i (i < CV = D4 / TX) of its rows. Per-thread state lives in
 * named variables (`s{m}_{n}`, `o{m}_{i}`, `m{m}`, `l{m}`): private arrays indexed by loop
 * counters end up in memory, named values stay in registers.
 * @module
 */
import { nanKeepingCap } from "./wgsl.ts";

/** The compile-time shape of one prefill variant. */
export interface FlashTile {
  /** Threads along keys / output columns, threads along rows. */
  tx: number;
  ty: number;
  /** Rows and keys of one thread's score tile. */
  rm: number;
  rn: number;
  /** vec4 columns of the head (D / 4). */
  d4: number;
  /** 16-byte loads per K/V row, and the K/V loads of one tile per thread. */
  v4r: number;
  /** Elements per u32 word of the K/V source. */
  epw: number;
  wg: number;
  /** Soft cap / ALiBi compiled in. */
  cap: boolean;
  alibi: boolean;
  /**
   * Unroll the score and PV loops: every workgroup-memory load then indexes a 2D array with a
   * loop-invariant row and a constant column, so its address is a register plus an immediate
   * (no per-load index arithmetic or bounds clamp).
   */
  unroll: boolean;
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** K/V loads of one tile per thread (ceil(BK * V4R / WG)). */
export function loadsPerThread(t: FlashTile): number {
  return Math.ceil((t.tx * t.rn * t.v4r) / t.wg);
}

/** A tile's unrolled index ranges, which every fragment walks. */
interface Unroll {
  t: FlashTile;
  /** Rows and keys of a thread's score tile, its output vec4 columns, its K/V loads. */
  M: number[];
  N: number[];
  CV: number[];
  NL: number[];
  /** Elements of a K/V source word. */
  E: number[];
  /** Whether the tile's loads divide evenly among the threads (no bounds check a load). */
  exact: boolean;
}

/** The ranges of tile `t`. */
function unrollOf(t: FlashTile): Unroll {
  return {
    t,
    M: range(t.rm),
    N: range(t.rn),
    CV: range(t.d4 / t.tx),
    NL: range(loadsPerThread(t)),
    E: range(t.epw),
    exact: (t.tx * t.rn * t.v4r) % t.wg === 0,
  };
}

/**
 * The fragments: ROWS (per-row token, head, position, slope), STATE (softmax state and
 * accumulators), LOAD_K / LOAD_V (a tile's global loads into registers, key tile at `kt0`),
 * STORE_K / STORE_V (decode into KVs), SCORE (the S = Q K^T loop body and declarations),
 * SCALE (soft cap and ALiBi), MASK (the mask of a partly visible tile), PMAX / SOFTMAX (row max
 * partials, then probabilities into Ps), PV (the P V loop), FINISH (normalise, store, LSE).
 */
export function generateFlash(t: FlashTile): Record<string, string> {
  const u = unrollOf(t);
  const j = (a: string[]) => a.join("\n");
  return {
    ROWS: j(rowsFragment(u)),
    STATE: j(stateFragment(u)),
    SLOTS: j(slotsFragment(u)),
    LOAD_K: j(loadFragment(u, "kw")),
    LOAD_V: j(loadFragment(u, "vw")),
    STORE_K: j(storeFragment(u, "kw")),
    STORE_V: j(storeFragment(u, "vw")),
    SDECL: j(u.M.flatMap((m) => u.N.map((n) => `    var s${m}_${n} = 0.0;`))),
    SCORE: j(scoreFragment(u)),
    SCALE: j(scaleFragment(u)),
    MASK: j(maskFragment(u)),
    PMAX: j(pmaxFragment(u)),
    SOFTMAX: j(softmaxFragment(u)),
    PV: j(pvFragment(u)),
    FINISH: j(finishFragment(u)),
  };
}

/** ROWS: each thread's key and column indices, and per row its token, head, position, slope. */
function rowsFragment({ t, M, N, CV }: Unroll): string[] {
  return [
    ...N.map((n) => `  let key${n} = tx + ${n * t.tx}u;`),
    ...CV.map((i) => `  let col${i} = tx + ${i * t.tx}u;`),
  ].concat(M.flatMap((m) => [
    `  let row${m} = ty + ${m * t.ty}u;`,
    `  let tok${m} = first + row${m} / hcnt;`,
    `  let h${m} = kvh * U.group + hfirst + row${m} % hcnt;`,
    `  let ok${m} = row${m} < nrows;`,
    `  let pos${m} = i32(tok${m}) + bmq;`,
    `  let sl${m} = ${
      t.alibi ? `select(0.0, bitcast<f32>(mdw[U.off_alibi + h${m}]), ok${m})` : "0.0"
    };`,
  ]));
}

/** STATE: each row's running max and sum (a sink's start where it has one), its accumulators. */
function stateFragment({ M, CV }: Unroll): string[] {
  return M.flatMap((m) => [
    `  var m${m} = MASK;`,
    `  var l${m} = 0.0;`,
    `  if (sinks && ok${m}) {`,
    `    m${m} = bitcast<f32>(mdw[U.off_sinks + h${m}]);`,
    `    l${m} = select(0.0, 1.0, tx == 0u);`,
    "  }",
    ...CV.map((i) => `  var o${m}_${i} = vec4<f32>(0.0);`),
  ]);
}

/** SLOTS: each of a thread's loads: its key and column in the tile, its row, its registers. */
function slotsFragment({ t, NL }: Unroll): string[] {
  return NL.flatMap((i) => [
    `  let ld_idx${i} = t + ${i * t.wg}u;`,
    `  let ld_j${i} = ld_idx${i} / V4R;`,
    `  let ld_c${i} = ld_idx${i} % V4R;`,
    `  let ld_in${i} = ld_idx${i} < BK * V4R;`,
    `  var ld_r${i} = vec2<u32>(0u);`,
    `  var kw${i} = vec4<u32>(0u);`,
    `  var vw${i} = vec4<u32>(0u);`,
  ]);
}

/** LOAD_K / LOAD_V: a tile's global loads into registers (K loads look the rows up, for V). */
function loadFragment({ NL, exact }: Unroll, w: "kw" | "vw"): string[] {
  return NL.flatMap((i) => {
    const cond = exact ? `kt0 + ld_j${i} < kend` : `ld_in${i} && kt0 + ld_j${i} < kend`;
    return [
      `    ${w}${i} = vec4<u32>(0u);`,
      `    if (${cond}) {`,
      ...(w === "kw" ? [`      ld_r${i} = kv_row(kt0 + ld_j${i}, kvh, rbase);`] : []),
      `      ${w}${i} = ${w === "kw" ? "src_k" : "src_v"}(ld_r${i}, ld_c${i});`,
      "    }",
    ];
  });
}

/** STORE_K / STORE_V: the loaded words decoded into the tile in workgroup memory (KVs). */
function storeFragment({ NL, E, exact }: Unroll, w: "kw" | "vw"): string[] {
  return NL.flatMap((i) => {
    const body = E.map((e) =>
      `KVs[ld_j${i}][ld_c${i} * EPW + ${e}u] = kv_decode16(${w}${i}, ${e}u);`
    );
    return exact ? body.map((b) => `    ${b}`) : [
      `    if (ld_in${i}) {`,
      ...body.map((b) => `      ${b}`),
      "    }",
    ];
  });
}

/** SCORE: S = Q K^T over the head's vec4 columns, unrolled or as a loop. */
function scoreFragment({ t, M, N }: Unroll): string[] {
  // One column c (a WGSL expression or a constant).
  const step = (c: string, ind: string) => [
    ...M.map((m) => `${ind}let q${m} = Qs[${c}][row${m}];`),
    ...N.map((n) => `${ind}let k${n} = KVs[key${n}][${c}];`),
    ...M.flatMap((m) => N.map((n) => `${ind}s${m}_${n} += dot(q${m}, k${n});`)),
  ];
  return t.unroll
    ? range(t.d4).flatMap((c) => ["    {", ...step(`${c}u`, "      "), "    }"])
    : ["    for (var c = 0u; c < D4; c++) {", ...step("c", "      "), "    }"];
}

/** SCALE: the soft cap and the ALiBi bias on each score, where compiled in. */
function scaleFragment({ t, M, N }: Unroll): string[] {
  const scale: string[] = [];
  for (const m of M) {
    for (const n of N) {
      const s = `s${m}_${n}`;
      if (t.cap) scale.push(`    ${s} = ${nanKeepingCap(s, "U.softcap", "U.softcap")};`);
      if (t.alibi) scale.push(`    ${s} -= sl${m} * f32(pos${m} - i32(kt + tx + ${n * t.tx}u));`);
    }
  }
  return scale;
}

/** MASK: the scores of keys a row cannot see, masked (a partly visible tile). */
function maskFragment({ t, M, N }: Unroll): string[] {
  return M.flatMap((m) =>
    N.map((n) =>
      `      ${`s${m}_${n}`} = select(MASK, s${m}_${n}, visible(pos${m}, kt + tx + ${
        n * t.tx
      }u, kend));`
    )
  );
}

/** A row's TX partials in `red` (vec4s), so that the row reads them in TX / 4 loads. */
function rowPartials(t: FlashTile, m: number): string[] {
  return range(t.tx / 4).map((x) => `red[row${m}][${x}u]`);
}

/** PMAX: each row's partial maximum of the thread's scores, into `red`. */
function pmaxFragment({ M, N }: Unroll): string[] {
  const mx = (m: number) => N.map((n) => `s${m}_${n}`).reduce((a, b) => `max(${a}, ${b})`);
  return M.map((m) => `    red[row${m}][tx / 4u][tx % 4u] = ${mx(m)};`);
}

/** SOFTMAX: the rows' new maxima, the rescale factors, the probabilities (into Ps), the sums. */
function softmaxFragment({ t, M, N }: Unroll): string[] {
  const red = (m: number) => `hmax(${rowPartials(t, m).reduce((a, b) => `max(${a}, ${b})`)})`;
  return M.flatMap((m) => [
    `    let mn${m} = max(m${m}, ${red(m)});`,
    `    let al${m} = exp(m${m} - mn${m});`,
    `    let mc${m} = max(mn${m}, HALF_MASK);`,
    ...N.map((n) => `    let p${m}_${n} = exp(s${m}_${n} - mc${m});`),
    `    l${m} = l${m} * al${m} + ${N.map((n) => `p${m}_${n}`).join(" + ")};`,
    `    m${m} = mn${m};`,
    ...N.map((n) => `    Ps[row${m}][(tx + ${n * t.tx}u) / 4u][tx % 4u] = p${m}_${n};`),
  ]);
}

/**
 * PV: O += P V. Tiles every row sees whole (`full`) take the plain steps (unrolled where the
 * tile says), the rest the masked loop.
 */
function pvFragment({ t, M, CV }: Unroll): string[] {
  // O += P V over the keys 4 j4 .. 4 j4 + 3 (j4 a WGSL expression; `k` its value if constant).
  // `masked`: a key the row cannot see adds nothing, whatever its value (its p is 0, and 0 x Inf
  // is NaN): tiles not every row sees whole, where a cache value may be Inf or NaN. Told by
  // visibility, not by p = 0: a visible key whose p underflowed keeps 0 x Inf (NaN, where float64
  // has Inf) instead of dropping out (a finite answer).
  const pvStep = (j4: string, k: number | null, masked = false) => [
    ...M.map((m) => `      let pj${m} = Ps[row${m}][${j4}];`),
    ...range(4).flatMap((e) => [
      ...CV.map((i) =>
        `      let v${e}_${i} = KVs[${k === null ? `4u * j4 + ${e}u` : `${4 * k + e}u`}][col${i}];`
      ),
      ...M.flatMap((m) =>
        CV.map((i) => {
          const v = masked
            ? `select(vec4<f32>(0.0), v${e}_${i}, visible(pos${m}, kt + 4u * j4 + ${e}u, kend))`
            : `v${e}_${i}`;
          return `      o${m}_${i} = fma(vec4<f32>(pj${m}[${e}]), ${v}, o${m}_${i});`;
        })
      ),
    ]),
  ];
  const pvLoop = (masked: boolean) => [
    "    for (var j4 = 0u; j4 < BK / 4u; j4++) {",
    ...pvStep("j4", null, masked),
    "    }",
  ];
  return [
    ...M.flatMap((m) => CV.map((i) => `    o${m}_${i} *= al${m};`)),
    "    if (full) {",
    ...(t.unroll
      ? range((t.tx * t.rn) / 4).flatMap((j4) => ["    {", ...pvStep(`${j4}u`, j4), "    }"])
      : pvLoop(false)),
    "    } else {",
    ...pvLoop(true),
    "    }",
  ];
}

/** FINISH: each row's sum from the partials, its output normalised and stored, its LSE. */
function finishFragment({ t, M, CV }: Unroll): string[] {
  return [
    ...M.map((m) => `  red[row${m}][tx / 4u][tx % 4u] = l${m};`),
    "  workgroupBarrier();",
    ...M.flatMap((m) => [
      `  let lt${m} = dot(${rowPartials(t, m).join(" + ")}, vec4<f32>(1.0));`,
      `  if (ok${m}) {`,
      `    let inv = select(U.v_scale / lt${m}, 0.0, lt${m} == 0.0); // NaN lt: NaN out`,
      `    let ob = (tok${m} * U.num_heads + h${m}) * D4 + tx;`,
      ...CV.map((i) => `    out_put4(ob + ${i * t.tx}u, o${m}_${i} * inv);`),
      "    if (tx == 0u) {",
      `      lse[h${m} * U.num_tokens + tok${m}] = select(m${m} + log(lt${m}), bitcast<f32>(0xff800000u | (U.flags & 0u)), lt${m} == 0.0);`,
      "    }",
      "  }",
    ]),
  ];
}
