/**
 * WGSL generator for the WEBGPU_DECODE split kernel (wgsl/decode_split.wgsl): the
 * straight-line INIT, STEP, STORE and GSUM fragments, unrolled for one compile-time
 * {@link KernelShape}, and the per-storage-dtype word decoders (fp8 also in byte pairs). A step's
 * partial dots are summed by a butterfly per value (GSUM) or, under the tunings `scatter_sums` /
 * `scatter_softmax`, by the transposed reductions of gpu/decode_scatter.ts.
 * @module
 */
import type { StorageDType } from "../core/types.ts";
import { stagedLoads, stagedStep } from "./decode_stage.ts";
import {
  laneBits,
  scatterDenominators,
  scatterInit,
  scatterSoftmax,
  transposedSums,
} from "./decode_scatter.ts";

/** The compile-time shape of one split kernel. */
export interface KernelShape {
  /** Query heads per kv head in the workgroup, kv heads per key group, keys per step. */
  hg: number;
  kh: number;
  u: number;
  lpk: number;
  /** vec4<u32> columns per lane per row (halves under `half`); value vec4s per vec4 column;
   * key groups per workgroup. */
  cpl: number;
  epw: number;
  nkg: number;
  sg: boolean;
  /** Each lane takes half a vec4 column (words 0-1 or 2-3 by lane parity) of a row: `cpl` counts
   * half columns, the key group spans lpk / 2 vec4 columns at a time, a lane decodes epw / 2
   * value vec4s of each. */
  half: boolean;
  alibi: boolean;
  /** Issue the value rows' loads together with the keys' (before the softmax). */
  early_v: boolean;
  /** Issue the next step's K and V loads before this step's arithmetic (double buffer). */
  prefetch: boolean;
  /** vec4<u32>s of the K + V tile staged in workgroup memory `skv` (0: plain loads; replaces
   * `prefetch`): gpu/decode_stage.ts. */
  stage: number;
  /** vec4<u32>s of one key row. */
  rv: number;
  /** End in wgsl/decode_epilogue.wgsl (needs nkg > 1) instead of storing the partial here. */
  epilogue: boolean;
  /** The workgroup spans several token items (`wg_tokens`, rows of one slice each): its
   * epilogue is told NONE (its key groups' row fields are not uniform; needs `epilogue`). */
  tokens?: boolean;
  /** Sum the U x F partial dots of a step by a transposed reduction (reduce-scatter by
   * recursive halving, then all-gather by recursive doubling: about 2 N shuffles for N values
   * instead of N log2 LPK); subgroups only. */
  scatter: boolean;
  /** The step's softmax on the scattered sums (gpu/decode_scatter.ts scatterSoftmax): each lane
   * takes the exp of its own scores only; subgroups only. */
  scatter_softmax: boolean;
  /** The scattered paths' final all-gather by indexed shuffles (needs `sgb`: SGID). */
  indexed: boolean;
  /** Key dots as fma chains into the score, value sums as vec4 fmas (tuning `fma_dots`). */
  fma?: boolean;
  /** Decoders of a vec4<u32> `w` into EPW vec4<f32>, in element order, or under `swz` in the
   * order (0, 2, 1, 3) of each word ({@link PAIR_DECODERS}). */
  dec: string[];
  /** The decoders' vec4s hold (0, 2, 1, 3): the query is loaded and the accumulators stored
   * through the same swizzle (.xzyw, its own inverse). */
  swz: boolean;
}

/** Decoders of a vec4<u32> word `w` into vec4<f32> values, per storage dtype. */
export const DECODERS: Record<StorageDType, string[]> = {
  float32: ["bitcast<vec4<f32>>(w)"],
  float16: [
    "vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y))",
    "vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w))",
  ],
  bfloat16: ["vec4<f32>(bf2(w.x), bf2(w.y))", "vec4<f32>(bf2(w.z), bf2(w.w))"],
  fp8_e4m3: ["e4m3x4(w.x)", "e4m3x4(w.y)", "e4m3x4(w.z)", "e4m3x4(w.w)"],
  fp8_e5m2: ["e5m2x4(w.x)", "e5m2x4(w.y)", "e5m2x4(w.z)", "e5m2x4(w.w)"],
};

/**
 * fp8 decoders in even / odd byte pairs (wgsl/decode_words.wgsl e4m3x4s, e5m2x4s): fewer integer
 * ops a word, each vec4 in the order (0, 2, 1, 3) of its word's elements (tuning `fp8_pairs`).
 */
export const PAIR_DECODERS: Partial<Record<StorageDType, string[]>> = {
  fp8_e4m3: ["e4m3x4s(w.x)", "e4m3x4s(w.y)", "e4m3x4s(w.z)", "e4m3x4s(w.w)"],
  fp8_e5m2: ["e5m2x4s(w.x)", "e5m2x4s(w.y)", "e5m2x4s(w.z)", "e5m2x4s(w.w)"],
};

/**
 * e4m3 decoders without the NaN fix-up (wgsl/decode_words.wgsl e4m3x4f, e4m3x4sf), for a cache
 * known to hold no NaN byte (gpu/kv_cache.ts `fp8_nan_free`); word order, then pairs.
 */
export const NAN_FREE_DECODERS: { words: string[]; pairs: string[] } = {
  words: ["e4m3x4f(w.x)", "e4m3x4f(w.y)", "e4m3x4f(w.z)", "e4m3x4f(w.w)"],
  pairs: ["e4m3x4sf(w.x)", "e4m3x4sf(w.y)", "e4m3x4sf(w.z)", "e4m3x4sf(w.w)"],
};

/**
 * The factor each storage dtype's decoders leave out (their values are the element's value
 * divided by it): the plan multiplies the score and value scales by it. fp8 e4m3 decodes
 * through f16 bit positions, 2^-8 of the value.
 */
export const DECODE_SCALE: Record<StorageDType, number> = {
  float32: 1,
  float16: 1,
  bfloat16: 1,
  fp8_e4m3: 256,
  fp8_e5m2: 1,
};

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * The straight-line fragments of decode_split.wgsl (INIT, STEP, STORE, GSUM), unrolled over
 * flat heads f = kh * hg + h, keys u < U, lane columns j < cpl and value vec4s e < ev (epw, or
 * epw / 2 under half columns); the value vec4 i = j * ev + e of a lane sits at vec4
 * lane * ev + j * lpk * ev + e of its head's row.
 */
export function generateDecodeSplit(k: KernelShape): Record<string, string> {
  const F = range(k.kh * k.hg),
    KH = range(k.kh),
    Us = range(k.u),
    J = range(k.cpl),
    ev = k.half ? k.epw / 2 : k.epw, // value vec4s a lane decodes of each (half) column
    cols = k.half ? k.lpk / 2 : k.lpk, // vec4 columns a key group covers at a time
    E = range(ev);
  const NV = range(k.cpl * ev);
  const sw = k.swz ? ".xzyw" : "";
  const off = (f: number, i: number) =>
    `${f}u * D4 + ${Math.floor(i / ev) * k.lpk * ev + (i % ev)}u`;
  const init: string[] = [];
  // s += q . x, and a += p x: as written, or as fmas (the chain's order: x, y, z, w).
  const keyDot = (s: string, q: string, x: string) =>
    k.fma
      ? `${s} = ${"xyzw".split("").reduce((acc, c) => `fma(${q}.${c}, ${x}.${c}, ${acc})`, s)};`
      : `${s} += dot(${q}, ${x});`;
  const valueSum = (a: string, p: string, x: string) =>
    k.fma ? `${a} = fma(vec4<f32>(${p}), ${x}, ${a});` : `${a} += ${p} * ${x};`;
  // The scattered paths need subgroups and several lanes a row.
  const scatterSm = k.scatter_softmax && k.sg && k.lpk > 1;
  if (scatterSm) init.push(...scatterInit(F.length, k.u, k.lpk, k.alibi));
  else if (k.scatter && k.sg) init.push(...laneBits(k.lpk));
  if (k.indexed) init.push(`  let sgb = sgid & ~${k.lpk - 1}u;`);
  if (k.half) init.push("  let hodd = (lane & 1u) != 0u;");
  for (const f of F) {
    init.push(`  var m${f} = NEG;`, `  var l${f} = 0.0;`);
    init.push(
      `  let sl${f} = ${k.alibi ? `bitcast<f32>(tab[P.slope_off + hq0 + ${f}u])` : "0.0"};`,
    );
    for (const i of NV) {
      init.push(
        `  let q${f}_${i} = qv(qb + ${off(f, i)})${sw};`,
        `  var a${f}_${i} = vec4<f32>(0.0);`,
      );
    }
  }
  const st: string[] = [];
  const pre: string[] = [];
  const word = (t: "k" | "v", u: number, kh: number, j: number) => `${t}w${u}_${kh}_${j}`;
  // The loads of one step (keys k0 .. k0 + U - 1): one block lookup (a step's keys share a
  // block: slices start at multiples of U, U divides BS), one row offset per key and kv head,
  // then `t`'s words into `${t}w{u}_{kh}_{j}` (declared with `decl`).
  const loads = (out: string[], ind: string, ts: ("k" | "v")[], decl: string) => {
    out.push(`${ind}let bq = block_of(bt, min(k0, kwe - 1u));`);
    for (const u of Us) {
      for (const kh of KH) {
        out.push(
          `${ind}let r${u}_${kh} = row_word(min(k0 + ${u}u, kwe - 1u) % BS, kvh0 + ${kh}u) + lw;`,
        );
      }
    }
    for (const t of ts) {
      for (const u of Us) {
        for (const kh of KH) {
          for (const j of J) {
            out.push(
              `${ind}${decl}${word(t, u, kh, j)} = load_${t}4(bq, r${u}_${kh} + ${j * cols * 4}u);`,
            );
          }
        }
      }
    }
  };
  // Where the arithmetic takes a word from: the current buffer (prefetch), the early loads, or
  // a load right there.
  const src = (t: "k" | "v", u: number, kh: number, j: number) =>
    k.stage
      ? `skv[${t === "v" ? k.stage / 2 : 0}u + sbase + ${(u * k.kh + kh) * k.rv + j * cols}u]`
      : k.prefetch
      ? `c${word(t, u, kh, j)}`
      : t === "k" || k.early_v
      ? word(t, u, kh, j)
      : `load_v4(bq, r${u}_${kh} + ${j * cols * 4}u)`;
  if (k.stage) {
    const wg = k.nkg * k.lpk;
    init.push(
      `  let sbase = kg * ${k.u * k.kh * k.rv}u + lw / 4u; // this lane's first staged vec4`,
    );
    pre.push(...stagedLoads(k.stage, wg, k.kh, k.rv, true));
    st.push(...stagedStep(k.stage, wg, k.kh, k.rv));
  } else if (k.prefetch) {
    for (const t of ["k", "v"] as const) {
      for (const u of Us) {
        for (const kh of KH) for (const j of J) pre.push(`  var ${word(t, u, kh, j)}: vec4<u32>;`);
      }
    }
    pre.push("  if (n_it > 0u) {", "    let k0 = kg0;");
    loads(pre, "    ", ["k", "v"], "");
    pre.push("  }");
    for (const t of ["k", "v"] as const) {
      for (const u of Us) {
        for (const kh of KH) {
          for (const j of J) st.push(`    let c${word(t, u, kh, j)} = ${word(t, u, kh, j)};`);
        }
      }
    }
    st.push("    if (it + 1u < n_it) {", "      let k0 = k0 + U;");
    loads(st, "      ", ["k", "v"], "");
    st.push("    }");
  } else {
    loads(st, "    ", k.early_v ? ["k", "v"] : ["k"], "let ");
  }
  // One row of kv head kh for key u: decode each lane column and apply `body`.
  const rows = (
    t: "k" | "v",
    u: number,
    kh: number,
    body: (f: number, i: number, e: number) => string,
    masked = false,
  ) => {
    for (const j of J) {
      // A key the row does not see has p = 0, and 0 x Inf is NaN: under `masked` its words are
      // zeroed (every storage dtype decodes a zero word to zeros).
      const w0 = masked ? `select(vec4<u32>(0u), ${src(t, u, kh, j)}, vis${u})` : src(t, u, kh, j);
      if (k.half) {
        st.push("    {", `      let w4 = ${w0};`, "      let w = select(w4, w4.zwxy, hodd);");
      } else {
        st.push("    {", `      let w = ${w0};`);
      }
      for (const e of E) st.push(`      let x${e} = ${k.dec[e]};`);
      for (const e of E) {
        for (const h of range(k.hg)) st.push(`      ${body(kh * k.hg + h, j * ev + e, e)}`);
      }
      st.push("    }");
    }
  };
  for (const u of Us) st.push(`    let vis${u} = k0 + ${u}u >= kt && k0 + ${u}u < ke;`);
  for (const u of Us) {
    for (const f of F) st.push(`    var s${u}_${f} = 0.0;`);
    for (const kh of KH) rows("k", u, kh, (f, i, e) => keyDot(`s${u}_${f}`, `q${f}_${i}`, `x${e}`));
  }
  const S = Us.flatMap((u) => F.map((f) => `s${u}_${f}`));
  if (scatterSm) st.push(...scatterSoftmax(F.length, k.u, k.lpk, NV.length, k.indexed));
  else if (k.lpk > 1 && k.sg && k.scatter) st.push(...transposedSums(S, k.lpk, k.indexed));
  else if (k.lpk > 1 && k.sg) st.push(...S.map((v) => `    ${v} = gsum(${v});`));
  if (k.lpk > 1 && !k.sg) {
    st.push(...S.map((v, i) => `    red[lid * UF + ${i}u] = ${v};`), "    workgroupBarrier();");
    st.push(...S.map((v, i) => `    ${v} = rsum(lid, ${i}u);`), "    workgroupBarrier();");
  }
  // Online softmax: rescale only when the running max grows (rare after the first keys;
  // the condition is the same in every lane of a key group).
  for (const f of scatterSm ? [] : F) {
    const mx = Us.map((u) => `s${u}_${f}`).reduce((a, b) => `max(${a}, ${b})`);
    for (const u of Us) {
      st.push(`    s${u}_${f} = logit(s${u}_${f}, k0 + ${u}u, vis${u}, pos, sl${f});`);
    }
    st.push(`    if (${mx} > m${f}) {`, `      let mx = ${mx};`, `      let al = exp(m${f} - mx);`);
    st.push(
      `      l${f} *= al;`,
      ...NV.map((i) => `      a${f}_${i} *= al;`),
      `      m${f} = mx;`,
      "    }",
    );
    for (const u of Us) {
      st.push(`    let p${u}_${f} = select(0.0, exp(s${u}_${f} - m${f}), vis${u});`);
    }
    st.push(`    l${f} += ${Us.map((u) => `p${u}_${f}`).join(" + ")};`);
  }
  // The value accumulation. A step whose keys the row does not all see (its first step under a
  // window or a slice start rounded down to U, its last partial one, whose loads repeat its
  // last key, a joint range of several tokens) zeroes the values of the keys it does not see:
  // an Inf there (an f32 value over f16's range written to an f16 cache, imported bytes) times
  // p = 0 would make the row NaN. Full steps, nearly all, take the plain copy.
  const accumulate = (masked: boolean) => {
    for (const u of Us) {
      for (const kh of KH) {
        rows("v", u, kh, (f, i, e) => valueSum(`a${f}_${i}`, `p${u}_${f}`, `x${e}`), masked);
      }
    }
  };
  st.push("    if (k0 >= kt && k0 + U <= ke) {");
  accumulate(false);
  st.push("    } else {");
  accumulate(true);
  st.push("    }");
  const sto: string[] = scatterSm ? scatterDenominators(F.length, k.u, k.lpk) : [];
  if (k.nkg === 1) {
    for (const f of F) {
      for (const i of NV) sto.push(`  part[ob + ${off(f, i)}] = a${f}_${i}${sw};`);
      sto.push(
        "  if (lane == 0u) {",
        `    part[mlb + ${f}u] = vec4<f32>(m${f}, l${f}, 0.0, 0.0);`,
        "  }",
      );
    }
  } else {
    sto.push(
      "  if (lane == 0u) {",
      ...F.map((f) => `    wml[kg * F + ${f}u] = vec2<f32>(m${f}, l${f});`),
      "  }",
    );
    sto.push(
      "  workgroupBarrier();",
      ...F.map((f) => `  let c${f} = exp(m${f} - wmax(hw + ${f}u));`),
    );
    // Round r: the r-th key group of every kv head block (disjoint heads) adds its state.
    sto.push("  for (var r = 0u; r < NKGH; r++) {", "    if (kgh == r) {");
    for (const f of F) {
      for (const i of NV) {
        sto.push(
          `      wput(r, hw * D4 + ${off(f, i)} + lane * LEV, (a${f}_${i} * c${f})${sw});`,
        );
      }
    }
    sto.push("    }", "    workgroupBarrier();", "  }");
  }
  if (k.nkg > 1) {
    sto.push(
      // Every flat head of the workgroup: FW may exceed WG (a software shape's key groups of
      // few lanes over many kv heads).
      "  for (var h = lid; h < FW; h += WG) {",
      "    let mx = wmax(h);",
      "    wfin[h] = vec2<f32>(mx, wsum(h, mx));",
      "  }",
      "  workgroupBarrier();",
      k.epilogue
        ? `  epilogue(item, tok, slot, ${
          k.tokens ? "NONE" : "tab[ib + 7u]"
        }, hqw, id % per_item, lid);`
        : "  partial(tok, slot, 0u, hqw, 0u, lid);",
    );
  }
  // Butterfly over the lanes of a key group, unrolled: constant masks become permutes.
  const masks = range(Math.log2(k.lpk)).map((i) => k.lpk >> (i + 1));
  const gsum = !k.sg ? "" : [
    "fn gsum(x: f32) -> f32 {",
    "  var v = x;",
    ...masks.map((m) => `  v += subgroupShuffleXor(v, ${m}u);`),
    "  return v;",
    "}",
  ].join("\n");
  return {
    INIT: init.join("\n"),
    PRE: pre.join("\n"),
    STEP: st.join("\n"),
    STORE: sto.join("\n"),
    GSUM: gsum,
  };
}
