/**
 * The STEP and PRE fragments of the WEBGPU_DECODE split kernel (gpu/decode_codegen.ts): a step's
 * K and V loads (gpu/decode_codegen_loads.ts), its key dots and their sums over the lanes of a
 * key group (a butterfly per value, workgroup memory, or the transposed reductions of
 * gpu/decode_scatter.ts), the online softmax and the value accumulation ({@link stepCode}).
 * @module
 */
import { scatterSoftmax, transposedSums } from "./decode_scatter.ts";
import type { KernelShape, Unrolled } from "./decode_kernel_shape.ts";
import { stepLoads, type WordSource } from "./decode_codegen_loads.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/** Decodes the rows of kv head kh for key u of K or V (`t`), applying `body` ({@link rowsOf}). */
type Rows = (
  t: "k" | "v",
  u: number,
  kh: number,
  body: (f: number, i: number, e: number) => string,
  masked?: boolean,
) => void;

/** The rows of a step, pushed to `st`, their words taken from `src`. */
function rowsOf(k: KernelShape, un: Unrolled, src: WordSource, st: string[]): Rows {
  const { J, E, ev } = un;
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
  return rows;
}

/** The PRE and STEP lines of kernel `k` (a staged tile adds its base offset to `init`). */
export function stepCode(
  k: KernelShape,
  un: Unrolled,
  init: string[],
): { pre: string[]; st: string[] } {
  const { F, KH, Us } = un;
  const st: string[] = [];
  const pre: string[] = [];
  const src = stepLoads(k, un, init, pre, st);
  const rows = rowsOf(k, un, src, st);
  // s += q . x, and a += p x: as written, or as fmas (the chain's order: x, y, z, w).
  const keyDot = (s: string, q: string, x: string) =>
    k.fma
      ? `${s} = ${"xyzw".split("").reduce((acc, c) => `fma(${q}.${c}, ${x}.${c}, ${acc})`, s)};`
      : `${s} += dot(${q}, ${x});`;
  const valueSum = (a: string, p: string, x: string) =>
    k.fma ? `${a} = fma(vec4<f32>(${p}), ${x}, ${a});` : `${a} += ${p} * ${x};`;
  for (const u of Us) st.push(`    let vis${u} = k0 + ${u}u >= kt && k0 + ${u}u < ke;`);
  for (const u of Us) {
    for (const f of F) st.push(`    var s${u}_${f} = 0.0;`);
    for (const kh of KH) rows("k", u, kh, (f, i, e) => keyDot(`s${u}_${f}`, `q${f}_${i}`, `x${e}`));
  }
  keySums(k, un, st);
  onlineSoftmax(un, st);
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
  return { pre, st };
}

/** The sums of a step's partial dots over the lanes of a key group, into `st`. */
function keySums(k: KernelShape, un: Unrolled, st: string[]): void {
  const { F, Us, NV, scatterSm } = un;
  const S = Us.flatMap((u) => F.map((f) => `s${u}_${f}`));
  if (scatterSm) st.push(...scatterSoftmax(F.length, k.u, k.lpk, NV.length, k.indexed));
  else if (k.lpk > 1 && k.sg && k.scatter) st.push(...transposedSums(S, k.lpk, k.indexed));
  else if (k.lpk > 1 && k.sg) st.push(...S.map((v) => `    ${v} = gsum(${v});`));
  if (k.lpk > 1 && !k.sg) {
    st.push(...S.map((v, i) => `    red[lid * UF + ${i}u] = ${v};`), "    workgroupBarrier();");
    st.push(...S.map((v, i) => `    ${v} = rsum(lid, ${i}u);`), "    workgroupBarrier();");
  }
}

/** The online softmax of a step's scores, into `st` (the scattered softmax did its own). */
function onlineSoftmax(un: Unrolled, st: string[]): void {
  const { F, Us, NV, scatterSm } = un;
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
}
