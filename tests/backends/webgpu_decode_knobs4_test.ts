/**
 * WEBGPU_DECODE's v0.7 knobs against CPU_REFERENCE on fresh random hostile batches (permuted
 * block table, NaN in unread slots, outputs poisoned): `wg_kv_heads` (a workgroup's key groups
 * spread over several kv heads, so it reads adjacent rows of each token slot) with each way the
 * split kernel ends (direct rows, the reduce pass, the fused reduce) and the `waves` policy, over
 * f16 / fp8 / bf16 / f32 caches, NHD and HND, window, soft cap, ALiBi, sinks and LSE; and the
 * residency probe (`probe_residency`), whose counters must balance: every split workgroup counted
 * in once and out once. The plan's counts prove which path ran.
 * @module
 */
import assert from "node:assert/strict";
import {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  makeWebGpuDecode,
} from "../../backends/webgpu_decode.ts";
import type { AttentionBackend } from "../../core/types.ts";
import type { BatchSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import {
  BF16_NHD_SPEC,
  decodePlanInfo,
  F16_NHD_SPEC,
  F32_MHA_SPEC,
  FP8_HND_SPEC,
} from "../support/decode_knob_specs.ts";
import { launch } from "../../gpu/launch.ts";
import { residencyReads, residencyUploads } from "../../gpu/decode_residency.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

/** The GPU kernel shape (8 or 16 key groups a workgroup on lavapipe), fixed slices. */
const BASE: DecodeTuning = {
  ...DEFAULT_DECODE_TUNING,
  workgroup_size: 128,
  keys_per_iter: 4,
  kv_heads_per_group: 1,
  waves: 0,
  target_workgroups: 4096,
  wave_workgroups: 528, // a GPU's wave: rows cut as a GPU cuts them, on lavapipe too
  min_split_keys: 16,
  direct_single: true,
  fused_reduce: false, // the cases that want it say so
};
/** Slices of >= 256 keys: a key group runs several steps. */
const LONG = { min_split_keys: 256 };

const backendOf = (t: Partial<DecodeTuning>) =>
  makeWebGpuDecode({ ...BASE, ...t }) as AttentionBackend;

/** Rows of several slices and of one, an empty request, a padded block table. */
/** The shared fp8 batch with an f16 cache, NHD and 4 kv heads. */
const F16 = F16_NHD_SPEC;
const FP8 = FP8_HND_SPEC, BF16 = BF16_NHD_SPEC, F32 = F32_MHA_SPEC;

const planInfo = (b: AttentionBackend, s: BatchSpec) => decodePlanInfo(GPU!, b, s);

/** Name, tuning, batch, kv head blocks a workgroup expected, epilogue expected. */
const CASES: [string, Partial<DecodeTuning>, BatchSpec, number, number][] = [
  [
    "4 kv heads a workgroup, direct rows: f16 NHD, window, sinks, ALiBi, cap, LSE",
    {
      wg_kv_heads: 4,
    },
    F16,
    4,
    1,
  ],
  [
    "2 a workgroup, fused reduce, fp8_pairs: fp8 e4m3 HND scaled",
    {
      wg_kv_heads: 2,
      fused_reduce: true,
      fp8_pairs: true,
    },
    FP8,
    2,
    2,
  ],
  [
    "2 a workgroup (GQA 8 untiled), reduce pass, long slices, prefetch: bf16 hd64 3-token rows",
    {
      wg_kv_heads: 2,
      direct_single: false,
      prefetch: true,
      ...LONG,
    },
    BF16,
    2,
    0,
  ],
  [
    "asked 8, 4 kv heads a workgroup, waves policy: f32 MHA, ALiBi, window",
    {
      wg_kv_heads: 8,
      waves: 2,
      wave_workgroups: 6,
    },
    F32,
    4,
    1,
  ],
  [
    "GQA group of 8 tiled by 4 (max_heads 4): one kv head a workgroup: bf16 hd64",
    {
      wg_kv_heads: 2,
      max_heads: 4,
    },
    BF16,
    1,
    1,
  ],
  [
    "with stage_kv (then off: plain loads): fp8 e4m3 HND",
    {
      wg_kv_heads: 2,
      stage_kv: true,
    },
    FP8,
    2,
    1,
  ],
];

for (const [name, tuning, spec, wh, epi] of CASES) {
  Deno.test(`decode wg_kv_heads: ${name}`, { ignore: NO_GPU }, async () => {
    const b = backendOf(tuning);
    const info = await planInfo(b, spec);
    const what = JSON.stringify(info);
    assert.equal(info.decode_wg_kv_heads, wh, what);
    assert.equal(info.decode_epilogue, epi, what);
    if (wh > 1) assert.equal(info.decode_staged_kv, 0, `no staged tile (${what})`);
    assert.ok(info.decode_items > info.decode_rows, `rows of several slices (${what})`);
    await checkBackend(b, GPU!, spec);
  });
}

/** The probe's counters: [0] running now, [1] most at once, [2] workgroups that ran. */
async function counters(zero: boolean): Promise<Uint32Array> {
  const res = await launch(GPU!, {
    label: "test.residency",
    uploads: zero ? residencyUploads(GPU!) : [],
    calls: [],
    reads: residencyReads(GPU!),
  });
  const w = new Uint32Array(res.parts[0].slice().buffer);
  res.release();
  return w;
}

const PROBED: [string, Partial<DecodeTuning>, BatchSpec, number][] = [
  ["reduce pass: bf16 hd64", { direct_single: false }, BF16, 0],
  [
    "fused reduce, 2 kv heads a workgroup: f16 NHD",
    {
      fused_reduce: true,
      wg_kv_heads: 2,
    },
    F16,
    2,
  ],
];

for (const [name, tuning, spec, epi] of PROBED) {
  Deno.test(`decode probe_residency: ${name}`, { ignore: NO_GPU }, async () => {
    const b = backendOf({ ...tuning, probe_residency: true });
    const info = await planInfo(b, spec);
    assert.equal(info.decode_probe, 1);
    assert.equal(info.decode_epilogue, epi, JSON.stringify(info));
    await counters(true);
    await checkBackend(b, GPU!, spec);
    const [now, peak, total] = await counters(false);
    assert.equal(now, 0, "every workgroup counted out");
    assert.equal(total, info.decode_workgroups, "every split workgroup counted in once");
    assert.ok(peak >= 1 && peak <= total, `peak ${peak} of ${total}`);
  });
}
