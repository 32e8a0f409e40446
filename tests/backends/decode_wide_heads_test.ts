/**
 * WEBGPU_DECODE when a workgroup holds more flat heads than invocations: key groups of few
 * lanes over several kv heads (a software adapter's shape under `max_lanes` 4: 2 key groups
 * of 4 lanes, 4 kv heads x GQA 4 = 16 flat heads in 8 invocations). The merge of the key groups
 * and every epilogue must then cover each flat head with a loop, not one invocation a head:
 * before the fix the heads past the workgroup size kept no (m, l) and came out NaN (found by
 * the lavapipe bench's `max_lanes` sweep). Fresh random hostile batches against CPU_REFERENCE,
 * with the separate reduce pass, one-slice rows written directly, and the fused reduce.
 */
import assert from "node:assert/strict";
import { DEFAULT_DECODE_TUNING, makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import type { AttentionBackend } from "../../core/types.ts";
import type { BatchSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { decodePlanInfo, FP8_HND_SPEC, KNOB_REQUESTS } from "../support/decode_knob_specs.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

/** 16 query heads over 4 kv heads at head size 64: one workgroup takes all 16. */
const WIDE = { num_heads: 16, num_kv_heads: 4, head_size: 64, requests: KNOB_REQUESTS };

const SPECS: [string, BatchSpec][] = [
  ["f16, fp8_e4m3 cache, HND, window, sinks, ALiBi, soft cap, LSE", { ...FP8_HND_SPEC, ...WIDE }],
  ["bf16, bf16 cache, NHD, sinks, LSE", {
    ...WIDE,
    dtype: "bfloat16",
    kv_cache_dtype: "bfloat16",
    layout: "NHD",
    block_size: 32,
    sinks: true,
    return_lse: true,
  }],
];

/** 2 key groups of 4 lanes, all 4 kv heads each; small slices so rows are cut. */
const SHAPE = {
  ...DEFAULT_DECODE_TUNING,
  max_lanes: 4,
  workgroup_size: 8,
  kv_heads_per_group: 4,
  waves: 0,
  target_workgroups: 4096,
  wave_workgroups: 528, // a GPU's wave: rows cut as a GPU cuts them, on lavapipe too
  min_split_keys: 16,
};

const EPILOGUES: [string, number, object][] = [
  ["reduce pass", 0, { direct_single: false, fused_reduce: false }],
  ["one-slice rows direct", 1, { direct_single: true, fused_reduce: false }],
  ["fused reduce", 2, { fused_reduce: true }],
];

for (const [ename, epilogue, knobs] of EPILOGUES) {
  for (const [sname, spec] of SPECS) {
    Deno.test(`decode, 16 flat heads in 8 invocations, ${ename}: ${sname}`, {
      ignore: NO_GPU || !GPU?.features.has("subgroups"),
    }, async () => {
      const b = makeWebGpuDecode({ ...SHAPE, ...knobs }) as AttentionBackend;
      const info = await decodePlanInfo(GPU!, b, spec);
      const what = JSON.stringify(info);
      assert.equal(info.decode_wg_invocations, 8, what);
      assert.equal(info.decode_wg_kv_heads, 1, what);
      assert.equal(info.decode_epilogue, epilogue, what);
      assert.ok(info.decode_items > info.decode_rows, `rows cut into slices (${what})`);
      await checkBackend(b, GPU!, spec);
    });
  }
}

/** The registered defaults at small head sizes: on a software adapter (8-lane subgroups) a head
 * of 32 f16 (or 64 fp8) is 4 vec4s a row, so 2 key groups of 4 lanes share a workgroup over all
 * 4 kv heads: 16 flat heads in 8 invocations, NaN in the heads past 8 before the fix. */
for (const [hd, kv] of [[32, "float16"], [64, "fp8_e4m3"]] as const) {
  Deno.test(`decode, default tuning, head ${hd}, ${kv} cache, GQA 4 over 4 kv heads`, {
    ignore: NO_GPU,
  }, async () => {
    const spec: BatchSpec = {
      ...SPECS[0][1],
      head_size: hd,
      kv_cache_dtype: kv,
      requests: [{ query_len: 1, seq_len: 300 }, ...KNOB_REQUESTS],
    };
    const b = makeWebGpuDecode({ ...DEFAULT_DECODE_TUNING }) as AttentionBackend;
    await checkBackend(b, GPU!, spec);
  });
}
