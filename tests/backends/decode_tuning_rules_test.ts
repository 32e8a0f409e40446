/**
 * `ATTN_DECODE_TUNING`'s numeric rules (backends/webgpu_decode_tuning.ts DECODE_TUNING_RULES):
 * every value refused here was taken before and, run through WEBGPU_DECODE / WEBGPU_FLASH on
 * lavapipe, answered wrong (`keys_per_iter` 3, `max_lanes` 3 or 6, `fallback_lanes` 6), failed
 * the call with a 500 (`keys_per_iter` -1 or 0.5, `max_lanes` 0 / -4 / 2.5, fractional
 * `kv_heads_per_group` / `max_heads` / `wg_kv_heads`, negative `wg_kv_heads`: internal_error;
 * `workgroup_size` 4096, `max_lanes` 6 under the prefill split: shader_compile_failed) or was
 * fitted silently into something it does not mean (negative or fractional counts, 0 where 0
 * means nothing, 1e12 bytes, 1e999 read as Infinity). The refusal names the field, its value
 * and the rule. Values within a rule that one layer or device cannot take are fitted at plan
 * time, and the GPU cases below hold those fits to right answers.
 */
import assert from "node:assert/strict";
import {
  DECODE_TUNING_RULES,
  DECODE_TUNING_SETTING,
  type DecodeTuning,
  decodeTuningProblem,
  DEFAULT_DECODE_TUNING,
  keepsTuningRule,
  tuningRuleText,
} from "../../backends/webgpu_decode_tuning.ts";
import { makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import { makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import { EnvValueError } from "../../core/env.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { type BatchSpec, generateBatch } from "../support/batches.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { checkBackend } from "../support/backend_check.ts";
import { decodePlanInfo } from "../support/decode_knob_specs.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

const PREFIX = "ATTN_DECODE_TUNING must be a JSON object of DecodeTuning fields " +
  "(backends/webgpu_decode_tuning.ts), got ";

/** What the setting says of `text`: null (taken) or its refusal's message. */
function refusal(text: string): string | null {
  try {
    DECODE_TUNING_SETTING.parse(text);
    return null;
  } catch (e) {
    assert.ok(e instanceof EnvValueError, String(e));
    assert.equal(e.variable, "ATTN_DECODE_TUNING");
    assert.equal(e.value, text);
    return e.message;
  }
}

const AUTO_1024 = "an integer from 1 to 1024, or 0 for automatic";
const STEP = "a power of two from 1 to 16, or 0 for automatic";
const LANES = "a power of two from 1 to 128";
const COUNT_0 = "an integer from 0 to 2^31 - 1";
const COUNT_1 = "an integer from 1 to 2^31 - 1";
const AUTO_COUNT = "an integer from 1 to 2^31 - 1, or 0 for automatic";

/** Each field's rule in words: the data, said once. */
const RULE_WORDS: Record<string, string> = {
  workgroup_size: AUTO_1024,
  keys_per_iter: STEP,
  gpu_keys_per_iter: STEP,
  kv_heads_per_group: AUTO_COUNT,
  max_lanes: LANES,
  fallback_lanes: LANES,
  max_heads: COUNT_1,
  max_flat_heads: COUNT_1,
  target_workgroups: AUTO_COUNT,
  waves: "an integer from 1 to 2^31 - 1, or 0 for the target_workgroups policy",
  wave_workgroups: AUTO_COUNT,
  slice_overhead: COUNT_0,
  min_split_keys: COUNT_0,
  stage_table_max: COUNT_0,
  stage_kv_bytes: COUNT_0,
  wg_kv_heads: COUNT_1,
  wg_tokens: "a power of two from 1 to 64",
};

/** Values refused, by field, each with what it did before on lavapipe. The JSON text is the
 * value as written (1e999 parses as Infinity). */
const REFUSED: [field: string, json: string, shown: string][] = [
  ["workgroup_size", "-3", "-3"], // silently one key group
  ["workgroup_size", "100.5", "100.5"], // silently rounded down
  ["workgroup_size", "1025", "1025"],
  ["workgroup_size", "4096", "4096"], // 500 shader_compile_failed (2048 invocations > 1024)
  ["workgroup_size", "1e999", "Infinity"], // silently one key group
  ["keys_per_iter", "3", "3"], // wrong answer
  ["keys_per_iter", "6", "6"], // wrong answer
  ["keys_per_iter", "-1", "-1"], // 500 internal_error (TypeError in codegen)
  ["keys_per_iter", "0.5", "0.5"], // 500 internal_error
  ["keys_per_iter", "32", "32"], // capped at the block size
  ["gpu_keys_per_iter", "32", "32"], // as keys_per_iter 32
  ["gpu_keys_per_iter", "3", "3"], // as keys_per_iter 3
  ["kv_heads_per_group", "-2", "-2"], // silently 1
  ["kv_heads_per_group", "1.5", "1.5"], // 500 internal_error at 3 kv heads (KH 1.5)
  ["max_lanes", "6", "6"], // wrong answer; 500 shader_compile_failed with scatter sums
  ["max_lanes", "3", "3"], // wrong answer
  ["max_lanes", "0", "0"], // 500 internal_error (NaN kv head blocks)
  ["max_lanes", "-4", "-4"], // 500 internal_error
  ["max_lanes", "2.5", "2.5"], // 500 internal_error (LPK 2.5)
  ["max_lanes", "256", "256"],
  ["fallback_lanes", "6", "6"], // wrong answer without subgroups
  ["fallback_lanes", "0", "0"], // 500 internal_error without subgroups
  ["max_heads", "0", "0"], // silently 1
  ["max_heads", "-1", "-1"], // silently 1
  ["max_heads", "1.5", "1.5"], // 500 internal_error at a GQA group of 3 (HG 1.5)
  ["max_flat_heads", "0", "0"],
  ["max_flat_heads", "-5", "-5"],
  ["max_flat_heads", "2.5", "2.5"],
  ["target_workgroups", "0.5", "0.5"], // silently no split
  ["target_workgroups", "-7", "-7"], // silently no split
  ["target_workgroups", "1e999", "Infinity"],
  ["waves", "-1", "-1"], // silently the target policy
  ["waves", "0.5", "0.5"],
  ["waves", "1e999", "Infinity"],
  ["wave_workgroups", "-3", "-3"],
  ["wave_workgroups", "0.5", "0.5"],
  ["slice_overhead", "-1000", "-1000"],
  ["slice_overhead", "1e999", "Infinity"],
  ["min_split_keys", "-5", "-5"],
  ["min_split_keys", "2.5", "2.5"],
  ["min_split_keys", "1e999", "Infinity"],
  ["stage_table_max", "-1", "-1"],
  ["stage_table_max", "1e12", "1000000000000"],
  ["stage_kv_bytes", "1e12", "1000000000000"],
  ["stage_kv_bytes", "-1", "-1"],
  ["stage_kv_bytes", "1e999", "Infinity"],
  ["wg_kv_heads", "-3", "-3"], // 500 internal_error
  ["wg_kv_heads", "0", "0"], // silently 1
  ["wg_kv_heads", "1.5", "1.5"], // 500 internal_error on GPU shapes (WH 0.5)
  ["wg_tokens", "0", "0"],
  ["wg_tokens", "3", "3"],
  ["wg_tokens", "128", "128"],
];

/** Values taken: each rule's edges, 0 where it means automatic, and values a shape fits. */
const TAKEN: Record<string, number[]> = {
  workgroup_size: [0, 1, 3, 100, 1024],
  keys_per_iter: [0, 1, 2, 4, 8, 16],
  kv_heads_per_group: [0, 1, 3, 2 ** 31 - 1],
  max_lanes: [1, 2, 64, 128],
  fallback_lanes: [1, 8, 128],
  max_heads: [1, 3, 2 ** 31 - 1],
  max_flat_heads: [1, 32],
  target_workgroups: [0, 1, 4096],
  waves: [0, 1, 4],
  wave_workgroups: [0, 1, 528],
  slice_overhead: [0, 192],
  min_split_keys: [0, 1, 64],
  stage_table_max: [0, 3, 1024],
  stage_kv_bytes: [0, 16, 2 ** 31 - 1],
  wg_kv_heads: [1, 3, 64],
  wg_tokens: [1, 2, 64],
};

Deno.test("decode tuning rules: one for every numeric field, the defaults keep them", () => {
  const numeric = Object.keys(DEFAULT_DECODE_TUNING).filter((k) =>
    typeof DEFAULT_DECODE_TUNING[k as keyof DecodeTuning] === "number"
  );
  assert.deepEqual(Object.keys(DECODE_TUNING_RULES).sort(), numeric.sort());
  assert.deepEqual(Object.keys(RULE_WORDS).sort(), numeric.sort());
  for (const [k, r] of Object.entries(DECODE_TUNING_RULES)) {
    assert.equal(tuningRuleText(r), RULE_WORDS[k], k);
  }
  assert.equal(decodeTuningProblem(DEFAULT_DECODE_TUNING), null);
  assert.equal(refusal(JSON.stringify(DEFAULT_DECODE_TUNING)), null);
});

Deno.test("decode tuning rules: a value that breaks its rule is refused, naming it", () => {
  for (const [field, json, shown] of REFUSED) {
    const text = `{"${field}":${json}}`;
    assert.equal(
      refusal(text),
      `${PREFIX}${JSON.stringify(text)}: ${field} = ${shown} breaks its rule: ${RULE_WORDS[field]}`,
      text,
    );
  }
  // Among valid fields, the first that breaks its rule is named.
  const text = '{"subgroups":false,"max_heads":2,"keys_per_iter":3}';
  assert.match(refusal(text) ?? "", /: keys_per_iter = 3 breaks its rule: /);
});

Deno.test("decode tuning rules: each rule's edges are taken", () => {
  for (const [field, values] of Object.entries(TAKEN)) {
    for (const v of values) {
      const text = `{"${field}":${v}}`;
      assert.equal(refusal(text), null, text);
      assert.equal(DECODE_TUNING_SETTING.parse(text)[field as keyof DecodeTuning], v, text);
      assert.ok(keepsTuningRule(DECODE_TUNING_RULES[field as "waves"], v), text);
    }
  }
  // Whole-valued numbers in other spellings are the same numbers.
  assert.equal(refusal('{"keys_per_iter":4.0,"workgroup_size":1e2}'), null);
});

Deno.test("decode tuning rules: decodeTuningProblem says the same of tunings built in code", () => {
  assert.equal(
    decodeTuningProblem({ ...DEFAULT_DECODE_TUNING, max_lanes: 6 }),
    `max_lanes = 6 breaks its rule: ${LANES}`,
  );
  assert.equal(decodeTuningProblem({ ...DEFAULT_DECODE_TUNING, wg_kv_heads: 2 }), null);
});

// --- Values within the rules that a layer or device cannot take: fitted at plan time. ---

/** f16, GQA 3 of 4 kv heads, head 128: rows of several slices and of one, a prefill request. */
const GQA3: BatchSpec = {
  dtype: "float16",
  kv_cache_dtype: "float16",
  layout: "NHD",
  block_size: 16,
  head_size: 128,
  num_heads: 12,
  num_kv_heads: 4,
  requests: [{ query_len: 1, seq_len: 300 }, { query_len: 1, seq_len: 37 }],
  sinks: true,
  return_lse: true,
};
const PREFILL: BatchSpec = {
  ...GQA3,
  requests: [{ query_len: 20, seq_len: 60 }, { query_len: 1, seq_len: 45 }],
};

/** The GPU kernel shape (several key groups a workgroup), as the knob tests pin it. */
const GPU_SHAPE = '"workgroup_size":128,"keys_per_iter":4,"kv_heads_per_group":1,"max_lanes":8';

/** WEBGPU_DECODE with the tuning `ATTN_DECODE_TUNING={json}` reads. */
const decodeWith = (json: string) =>
  makeWebGpuDecode({ ...DECODE_TUNING_SETTING.parse(`{${json}}`) }) as AttentionBackend;

/** WEBGPU_FLASH (portable kernels) with that tuning for its split-KV rows. */
const flashWith = (json: string) =>
  makeWebGpuFlash({
    tile: null,
    mma: false,
    prefill_split: true,
    decode: { ...DECODE_TUNING_SETTING.parse(`{${json}}`) },
  }) as AttentionBackend;

/** A plan count of `b` on a fresh batch of `s` (the plan must cut decode items). */
async function planCount(b: AttentionBackend, s: BatchSpec, name: string): Promise<number> {
  const info = await decodePlanInfo(GPU!, b, s);
  assert.ok(info.decode_items > 0, JSON.stringify(info));
  return info[name];
}

/** The split kernel's compile-time values, from its key in the plan's kernel keys. */
function splitConsts(kernels: string): Record<string, string> {
  const m = kernels.match(/decode_split\(([^)]*)\)/);
  assert.ok(m, kernels);
  return Object.fromEntries(m[1].split(",").map((kv) => kv.split("=") as [string, string]));
}

/** Whether the subgroup size caps the lanes a key row (the device's smallest subgroup). */
const subgroupLanes = () => GPU!.adapter_info.subgroup_min_size ?? 0;

/** Cases of a value within its rule that the layer or device cannot take as it is: the
 * tuning, what the split kernel's values must be, and the note. */
const FITTED: [json: string, want: (c: Record<string, string>) => boolean, note: string][] = [
  ['"kv_heads_per_group":3', (c) => c.kh === "2", "3 does not divide 4 kv heads: 2"],
  [`${GPU_SHAPE},"max_heads":2`, (c) => c.hg === "1", "2 does not divide the GQA group 3: 1"],
  ['"workgroup_size":3', (c) => c.wg === c.lpk, "under one key row's lanes: one key group"],
  [
    '"max_lanes":128',
    (c) => c.sg === "false" || Number(c.lpk) <= subgroupLanes(),
    "capped by the subgroup size and the row",
  ],
  [
    '"subgroups":false,"fallback_lanes":128',
    (c) => c.sg === "false" && Number(c.lpk) <= 32,
    "capped by max_lanes and the row",
  ],
  ['"subgroups":false,"fallback_lanes":1', (c) => c.lpk === "1", "one lane, no subgroups"],
  ['"keys_per_iter":16', (c) => c.u === "16", "a whole block a step"],
  [`${GPU_SHAPE},"wg_kv_heads":3`, (c) => c.wh === "2", "3 does not divide 4 kv head blocks"],
  [
    `${GPU_SHAPE},"stage_kv":true,"stage_kv_bytes":2147483647`,
    (c) => c.skv !== undefined,
    "capped by the device's workgroup memory",
  ],
  [
    `${GPU_SHAPE},"stage_table":true,"stage_table_max":3`,
    (c) => ["0", "1", "2"].includes(c.tb),
    "staged entries a power of two <= 3, or none",
  ],
];

for (const [json, want, note] of FITTED) {
  Deno.test(`decode tuning fitted at plan time: {${json}} (${note})`, {
    ignore: NO_GPU,
  }, async () => {
    for (const [b, s] of [[decodeWith(json), GQA3], [flashWith(json), PREFILL]] as const) {
      await checkBackend(b, GPU!, s);
      const g = generateBatch(s, 1);
      const cache = await GpuKvCache.fromBytes(GPU!, g.cache_spec!, g.key_cache, g.value_cache);
      try {
        const plan = await b.plan(validHostBatch(g.batch, cache), { gpu: GPU! }) as unknown as {
          kernels: string[];
        };
        b.disposePlan?.(plan as never);
        const c = splitConsts(plan.kernels.join(" + "));
        assert.ok(want(c), `${json}: ${JSON.stringify(c)}`);
      } finally {
        cache.destroy();
      }
    }
  });
}

Deno.test(
  "decode tuning fitted at plan time: wg_kv_heads over the kv head blocks takes them all",
  { ignore: NO_GPU },
  async () => {
    const b = decodeWith(`${GPU_SHAPE},"wg_kv_heads":64`);
    assert.equal(await planCount(b, GQA3, "decode_wg_kv_heads"), 4);
    await checkBackend(b, GPU!, GQA3);
  },
);
