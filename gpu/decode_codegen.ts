/**
 * WGSL generator for the WEBGPU_DECODE split kernel (wgsl/decode_split.wgsl): the
 * straight-line INIT, STEP, STORE and GSUM fragments, unrolled for one compile-time
 * {@link KernelShape}, and the per-storage-dtype word decoders (fp8 also in byte pairs). A step's
 * partial dots are summed by a butterfly per value (GSUM) or, under the tunings `scatter_sums` /
 * `scatter_softmax`, by the transposed reductions of gpu/decode_scatter.ts.
 * Re-exported from their own modules: the shape (gpu/decode_kernel_shape.ts) and the decoders
 * (gpu/decode_decoders.ts); the STEP and PRE fragments come from gpu/decode_codegen_step.ts.
 * @module
 */
import { laneBits, scatterDenominators, scatterInit } from "./decode_scatter.ts";
import { type KernelShape, type Unrolled, unrolled } from "./decode_kernel_shape.ts";
import { stepCode } from "./decode_codegen_step.ts";

export type { KernelShape } from "./decode_kernel_shape.ts";
export { DECODE_SCALE, DECODERS, NAN_FREE_DECODERS, PAIR_DECODERS } from "./decode_decoders.ts";

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * The straight-line fragments of decode_split.wgsl (INIT, STEP, STORE, GSUM), unrolled over
 * flat heads f = kh * hg + h, keys u < U, lane columns j < cpl and value vec4s e < ev (epw, or
 * epw / 2 under half columns); the value vec4 i = j * ev + e of a lane sits at vec4
 * lane * ev + j * lpk * ev + e of its head's row.
 */
export function generateDecodeSplit(k: KernelShape): Record<string, string> {
  const un = unrolled(k);
  const init = initCode(k, un);
  const { pre, st } = stepCode(k, un, init);
  const sto = storeCode(k, un);
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

/** INIT: the scattered paths' lane state, and each flat head's query, max, sum, accumulators. */
function initCode(k: KernelShape, un: Unrolled): string[] {
  const { F, NV, sw, off, scatterSm } = un;
  const init: string[] = [];
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
  return init;
}

/** STORE: the partial of a lone key group, or the merge of a workgroup's key groups. */
function storeCode(k: KernelShape, un: Unrolled): string[] {
  const { F, NV, sw, off, scatterSm } = un;
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
  return sto;
}
