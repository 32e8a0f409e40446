/**
 * The tensor-core prefill kernel's WGSL (wgsl/flash_mma.wgsl) through Tint on Dawn's null
 * backend, which grants `chromium-experimental-subgroup-matrix` under `allow_unsafe_apis`: every
 * named shape (the defaults, direct loads, matrix staging, split chains, per-subgroup rescale, D
 * split, the epilogue's variants) over the targets the plans build (f16, bf16 and fp8 caches,
 * bf16 data, encoder K/V, window, soft cap, ALiBi and sinks, non-causal, HND, two cache
 * buffers). Before this file the kernel met Tint only on the GPU machine, so a kernel change
 * Tint refuses (uniformity, types) failed only there. Skipped, with Dawn's reason, where
 * dawn.node cannot load or the null adapter lacks the feature.
 * @module
 */
import assert from "node:assert/strict";
import { FLASH_MMA, MMA_FEATURE } from "../../gpu/flash_mma_kernel.ts";
import {
  fullShape,
  MMA_SHAPES,
  MMA_VARIANTS,
  type MmaConsts,
  type MmaShape,
  mmaShapeProblem,
  type MmaTarget,
} from "../../gpu/flash_mma_shape.ts";
import { kernelWgsl } from "../../gpu/kernel.ts";
import { H200_F16_TARGET } from "../support/mma_case.ts";
import { type NullDawn, nullDawn, tintErrors } from "../support/tint.ts";

const dawn = await nullDawn();
const reason = typeof dawn === "string"
  ? dawn
  : new Set<string>(dawn.device.features).has(MMA_FEATURE)
  ? null
  : `the null adapter does not grant ${MMA_FEATURE}`;
if (reason) console.warn(`tint validation of flash_mma skipped: ${reason}`);

const TARGETS: [string, Partial<MmaTarget>][] = [
  ["f16 cache", {}],
  ["bf16 data and cache, window, soft cap, sinks", {
    kv: "bfloat16",
    dtype: "bfloat16",
    window: true,
    softcap: true,
    sinks: true,
  }],
  ["fp8 e4m3 cache, non-causal, ALiBi, HND", {
    kv: "fp8_e4m3",
    causal: false,
    alibi: true,
    nhd: false,
  }],
  ["encoder K/V (bf16 data), non-causal window", {
    kv: "bfloat16",
    dtype: "bfloat16",
    enc: true,
    causal: false,
    window: true,
  }],
  ["f16 cache in two buffers, head 64", { nchunk: 2, d: 64 }],
];

/** The shapes: every named one and the default list's, each once. */
const SHAPES: [string, MmaShape][] = [
  ...Object.entries(MMA_VARIANTS),
  ...MMA_SHAPES.map((s, i) => [`default ${i}`, s] as [string, MmaShape]),
];

for (const [tname, over] of TARGETS) {
  Deno.test({
    name: `tint accepts flash_mma: every shape, ${tname}`,
    ignore: reason !== null,
    async fn() {
      const t = { ...H200_F16_TARGET, ...over } as MmaTarget;
      let compiled = 0;
      for (const [name, shape] of SHAPES) {
        if (mmaShapeProblem(t, shape)) continue; // that shape refuses this target
        const c = { ...t, ...fullShape(shape) } as MmaConsts;
        const code = await kernelWgsl(FLASH_MMA, c, FLASH_MMA.enables!(c));
        assert.deepEqual(await tintErrors(dawn as NullDawn, code), [], `${name}, ${tname}`);
        compiled++;
      }
      assert.ok(compiled >= 4, `${compiled} shapes compiled for ${tname}`);
    },
  });
}
