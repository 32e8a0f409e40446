/**
 * bench/mma_bench.ts's loop ablations of the tensor-core kernel (gpu/flash_mma_shape.ts
 * MmaAblation `rescale`, `live`, `bt`, `loop`): each leaves out exactly its part of the key
 * loop and nothing else, and no ablation touches the default source.
 */
import assert from "node:assert/strict";
import { flashMmaSource } from "../../gpu/flash_mma_codegen.ts";
import { fullShape, MMA_VARIANTS, type MmaAblation } from "../../gpu/flash_mma_shape.ts";
import { H200_F16_TARGET } from "../support/mma_case.ts";

const t = { ...H200_F16_TARGET, causal: true, window: false };
const loopOf = async (ablate: MmaAblation | "") => {
  const src = await flashMmaSource({
    ...t,
    ...fullShape({ ...MMA_VARIANTS["w8r1k16-f"], ablate }),
  });
  return src.slice(src.indexOf("for (var kt = kstart"), src.indexOf("var inv:"));
};

Deno.test("mma ablations: rescale, live, bt and loop leave out their part of the key loop", async () => {
  const base = await loopOf("");
  const has = {
    rescale: /scale_rows\(|workgroupUniformLoad\(&s_resc\)/,
    live: /tile_live\(/,
    bt: /s_blk\[par \* NBT \+ t\] = blk_of/,
  };
  for (const re of Object.values(has)) assert.match(base, re);
  for (const [cut, re] of Object.entries(has)) {
    const src = await loopOf(cut as MmaAblation);
    assert.doesNotMatch(src, re, cut);
    for (const [other, keep] of Object.entries(has)) if (other !== cut) assert.match(src, keep);
  }
  const loop = await loopOf("loop");
  for (const re of Object.values(has)) assert.doesNotMatch(loop, re);
  assert.match(loop, /subgroupMatrixMultiplyAccumulate/);
});
