/**
 * `gpu_keys_per_iter`, what `keys_per_iter` 0 means on GPU adapters (backends/decode_shape.ts):
 * unset, decode rows take 4 keys a step and the prefill rows the split-KV kernels run take 8
 * (prefillSplitTuning, PREFILL_GPU_KEYS_PER_ITER); a value ATTN_DECODE_TUNING names reaches both
 * (session 33's review found the prefill rows' 8 written over it); `keys_per_iter` named beats
 * it; software adapters keep 1. On a fake H100-like context (decodeShape reads only its
 * adapter info and limits).
 */
import assert from "node:assert/strict";
import { decodeShape, isSoftware } from "../../backends/decode_shape.ts";
import { DECODE_TUNING_SETTING } from "../../backends/webgpu_decode_tuning.ts";
import {
  PREFILL_GPU_KEYS_PER_ITER,
  prefillSplitTuning,
} from "../../backends/prefill_split_tuning.ts";
import type { GpuContext } from "../../core/types.ts";
import { FAKE_SHAPE_LAYER, FAKE_SHAPE_SPEC, fakeMmaContext } from "../support/fake_device.ts";

const LAYER = FAKE_SHAPE_LAYER, SPEC = FAKE_SHAPE_SPEC;
const GPU = fakeMmaContext(false); // subgroups, not a software adapter

/** Keys a step of decode rows and of prefill rows under ATTN_DECODE_TUNING `text`. */
function keysAStep(text: string, ctx: GpuContext = GPU): { decode: number; prefill: number } {
  const env = DECODE_TUNING_SETTING.parse(text);
  return {
    decode: decodeShape(ctx, env, LAYER, SPEC, "float16").u,
    prefill: decodeShape(ctx, prefillSplitTuning(env, isSoftware(ctx)), LAYER, SPEC, "float16").u,
  };
}

Deno.test("gpu_keys_per_iter: unset, 4 for decode rows and 8 for prefill rows on GPUs", () => {
  assert.deepEqual(keysAStep("{}"), { decode: 4, prefill: PREFILL_GPU_KEYS_PER_ITER });
  assert.equal(PREFILL_GPU_KEYS_PER_ITER, 8);
});

for (const named of [2, 16]) {
  Deno.test(`gpu_keys_per_iter: ${named} named reaches decode and prefill rows`, () => {
    assert.deepEqual(keysAStep(`{"gpu_keys_per_iter":${named}}`), {
      decode: named,
      prefill: named,
    });
  });
}

Deno.test("gpu_keys_per_iter: keys_per_iter named beats it; capped by the block size", () => {
  assert.deepEqual(keysAStep('{"keys_per_iter":2,"gpu_keys_per_iter":16}'), {
    decode: 2,
    prefill: 2,
  });
  const bs8 = { ...SPEC, block_size: 8 };
  const env = DECODE_TUNING_SETTING.parse("{}");
  assert.equal(decodeShape(GPU, prefillSplitTuning(env, false), LAYER, bs8, "float16").u, 8);
  const bs4 = { ...SPEC, block_size: 4 };
  assert.equal(decodeShape(GPU, prefillSplitTuning(env, false), LAYER, bs4, "float16").u, 4);
});

Deno.test("gpu_keys_per_iter: software adapters keep 1 key a step", () => {
  const soft: GpuContext = {
    ...GPU,
    adapter_info: {
      ...GPU.adapter_info,
      vendor: "mesa",
      device: "llvmpipe",
      is_fallback_adapter: true,
    },
  };
  assert.deepEqual(keysAStep('{"gpu_keys_per_iter":16}', soft), { decode: 1, prefill: 1 });
});

Deno.test("prefill rows on a GPU: 64 invocations, 8 lanes a key row, 4 tokens; software keeps its shape", () => {
  const env = DECODE_TUNING_SETTING.parse("{}");
  const gpu = decodeShape(GPU, prefillSplitTuning(env, false), LAYER, SPEC, "float16");
  assert.deepEqual([gpu.wg, gpu.lpk, gpu.wt], [64, 8, 4]);
  // Decode rows keep theirs.
  const dec = decodeShape(GPU, env, LAYER, SPEC, "float16");
  assert.deepEqual([dec.wg, dec.lpk, dec.wt], [128, 16, 1]);
  // What ATTN_DECODE_TUNING names is kept.
  const named = DECODE_TUNING_SETTING.parse('{"max_lanes":16,"workgroup_size":128}');
  const kept = decodeShape(GPU, prefillSplitTuning(named, false), LAYER, SPEC, "float16");
  assert.deepEqual([kept.wg, kept.lpk, kept.wt], [128, 16, 4]);
});

Deno.test("prefill rows on a GPU: a GQA group of 8 at head size 128 is tiled by 4 heads to take 8 lanes", () => {
  const env = DECODE_TUNING_SETTING.parse("{}");
  const gqa8 = { ...LAYER, num_heads: 16 }; // 2 kv heads: groups of 8
  const t = prefillSplitTuning(env, false, gqa8);
  const shape = decodeShape(GPU, t, gqa8, SPEC, "float16");
  assert.deepEqual([shape.wg, shape.lpk, shape.wt, shape.hg, shape.tiles], [64, 8, 4, 4, 2]);
  assert.deepEqual([t.longest_first, t.indexed_gather, t.max_heads], [true, true, 4]);
  // A max_heads named over what fits keeps 128 invocations and 16 lanes for the whole group.
  const named = DECODE_TUNING_SETTING.parse('{"max_heads":16}');
  const wide = decodeShape(GPU, prefillSplitTuning(named, false, gqa8), gqa8, SPEC, "float16");
  assert.deepEqual([wide.wg, wide.lpk, wide.hg], [128, 16, 8]);
  // Where no tiling was measured to pay, the untiled shape: head size 256 (tiles of 2 heads),
  // a group of 7 (4 does not divide it), a max_lanes named.
  const d256 = { ...gqa8, head_size: 256 };
  const big = decodeShape(GPU, prefillSplitTuning(env, false, d256), d256, SPEC, "float16");
  assert.deepEqual([big.wg, big.hg, big.tiles], [128, 8, 1]);
  const gqa7 = { ...LAYER, num_heads: 14 };
  const seven = decodeShape(GPU, prefillSplitTuning(env, false, gqa7), gqa7, SPEC, "float16");
  assert.deepEqual([seven.wg, seven.lpk, seven.hg, seven.tiles], [128, 16, 7, 1]);
  const lanes = DECODE_TUNING_SETTING.parse('{"max_lanes":16}');
  const named16 = decodeShape(GPU, prefillSplitTuning(lanes, false, gqa8), gqa8, SPEC, "float16");
  assert.deepEqual([named16.wg, named16.lpk, named16.hg], [128, 16, 8]);
  // Software adapters and prefill_gpu_tuning false: max_heads as the tuning has it.
  assert.equal(prefillSplitTuning(env, true, gqa8).max_heads, 8);
  const off = DECODE_TUNING_SETTING.parse('{"prefill_gpu_tuning":false}');
  assert.equal(prefillSplitTuning(off, false, gqa8).max_heads, 8);
  // The bench's layer (4 heads a group) takes the 8 lanes.
  const four = decodeShape(GPU, prefillSplitTuning(env, false, LAYER), LAYER, SPEC, "float16");
  assert.deepEqual([four.wg, four.lpk], [64, 8]);
  // Head size 64 at a group of 8: 8 x 64 / 8 = 64 elements a lane, within the measured.
  const d64 = { ...gqa8, head_size: 64 };
  const small = decodeShape(GPU, prefillSplitTuning(env, false, d64), d64, SPEC, "float16");
  assert.deepEqual([small.wg, small.lpk], [64, 8]);
});

Deno.test("prefill rows on a GPU: prefill_gpu_tuning false keeps the tuning's own fields", () => {
  const off = DECODE_TUNING_SETTING.parse('{"prefill_gpu_tuning":false}');
  const t = prefillSplitTuning(off, false, LAYER);
  assert.deepEqual(
    [t.workgroup_size, t.max_lanes, t.indexed_gather, t.longest_first],
    [0, 32, false, false],
  );
  const shape = decodeShape(GPU, t, LAYER, SPEC, "float16");
  assert.deepEqual([shape.wg, shape.lpk, shape.wt], [128, 16, 4]);
});
