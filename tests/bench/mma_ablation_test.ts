/**
 * bench/mma_bench.ts's loop ablations of the tensor-core kernel (gpu/flash_mma_ablation.ts
 * MmaAblation `rescale`, `live`, `loop`): on v0.7's fast shape and on the default (late
 * next-tile stores), each leaves out exactly its part of the key loop and nothing else; and the
 * per-subgroup rescale refuses the two that would cut its lane flags.
 */
import assert from "node:assert/strict";
import { flashMmaSource } from "../../gpu/flash_mma_codegen.ts";
import {
  fullShape,
  MMA_VARIANTS,
  type MmaAblation,
  mmaShapeProblem,
} from "../../gpu/flash_mma_shape.ts";
import { H200_F16_TARGET } from "../support/mma_case.ts";

const t = { ...H200_F16_TARGET, causal: true, window: false };
const loopOf = async (variant: string, ablate: MmaAblation | "") => {
  const src = await flashMmaSource({ ...t, ...fullShape({ ...MMA_VARIANTS[variant], ablate }) });
  return src.slice(src.indexOf("for (var kt = kstart"), src.indexOf("var inv:"));
};

for (const variant of ["w8r1k16-f", "w8r1k16-fl"]) {
  Deno.test(`mma ablations of ${variant}: each leaves out its part of the key loop`, async () => {
    const has: Record<string, RegExp> = {
      rescale: /scale_rows\(|workgroupUniformLoad\(&s_u\[2\]\)/,
      live: /tile_live\(/,
    };
    const base = await loopOf(variant, "");
    for (const re of Object.values(has)) assert.match(base, re);
    for (const [cut, re] of Object.entries(has)) {
      const src = await loopOf(variant, cut as MmaAblation);
      assert.doesNotMatch(src, re, cut);
      for (const [other, keep] of Object.entries(has)) if (other !== cut) assert.match(src, keep);
    }
    const loop = await loopOf(variant, "loop");
    for (const re of Object.values(has)) assert.doesNotMatch(loop, re);
    assert.match(loop, /subgroupMatrixMultiplyAccumulate/);
  });
}

Deno.test("mma ablations: sgresc refuses rescale and loop, takes the others", () => {
  const fu = MMA_VARIANTS["w8r1k16-fu"];
  for (const ablate of ["rescale", "loop"] as const) {
    assert.match(String(mmaShapeProblem(t, { ...fu, ablate })), /lane flags/);
  }
  for (const ablate of ["live", "softmax"] as const) {
    assert.equal(mmaShapeProblem(t, { ...fu, ablate }, 49152), null);
  }
});

// v0.9's epilogue cut left O without a reader when the rescale was cut too, and the compiler
// dropped PV (bench/NOTES.md v0.10): every cut that keeps PV must keep a store of each O
// accumulator after the loop.
Deno.test("mma ablations: cuts that keep PV keep a reader of every O accumulator", async () => {
  const shape = MMA_VARIANTS["w8r1k16-fl"];
  for (const ablate of ["epilogue", "rescale+epilogue", "bare", "loop+softmax+epilogue"]) {
    const src = await flashMmaSource({ ...t, ...fullShape({ ...shape, ablate } as never) });
    const tail = src.slice(src.indexOf("var inv:"));
    assert.match(src, /o_0_0 = subgroupMatrixMultiplyAccumulate\(/, ablate);
    for (let c = 0; c < t.d / t.n; c++) {
      assert.match(
        tail,
        new RegExp(`subgroupMatrixStore<row_major>\\(&s_s, [^;]*, o_0_${c}, SSTR\\)`),
        `${ablate}: o_0_${c}`,
      );
    }
  }
});
