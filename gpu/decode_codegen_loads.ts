/**
 * The K and V loads of one step of the WEBGPU_DECODE split kernel (gpu/decode_codegen.ts): the
 * keys' (and under `early_v` the values') loads in the step, the next step's loads into a double
 * buffer (`prefetch`), or the tile staged in workgroup memory (`stage`, gpu/decode_stage.ts);
 * and where the step's arithmetic takes each word from ({@link stepLoads}).
 * @module
 */
import { stagedLoads, stagedStep } from "./decode_stage.ts";
import type { KernelShape, Unrolled } from "./decode_kernel_shape.ts";

/** Where the arithmetic takes word j of key u's row of kv head kh from, of K or V (`t`). */
export type WordSource = (t: "k" | "v", u: number, kh: number, j: number) => string;

const word = (t: "k" | "v", u: number, kh: number, j: number) => `${t}w${u}_${kh}_${j}`;

/** The writer of one step's loads into a list of lines (`out`), as its comment says. */
function loadsOf(un: Unrolled) {
  const { Us, KH, J, cols } = un;
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
  return loads;
}

/** Where the arithmetic takes a word from ({@link WordSource}). */
function sourceOf(k: KernelShape, un: Unrolled): WordSource {
  const { cols } = un;
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
  return src;
}

/**
 * The K and V loads of a step: the prologue's into `pre`, the step's into `st` (a staged tile
 * also puts its base offset into `init`). Returns where the arithmetic takes each word from.
 */
export function stepLoads(
  k: KernelShape,
  un: Unrolled,
  init: string[],
  pre: string[],
  st: string[],
): WordSource {
  const { Us, KH, J } = un;
  const loads = loadsOf(un);
  const src = sourceOf(k, un);
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
  return src;
}
