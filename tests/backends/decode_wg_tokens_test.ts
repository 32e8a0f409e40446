/**
 * WEBGPU_DECODE's `wg_tokens` (a workgroup's key groups spread over several consecutive query
 * tokens of one request, reading each K/V row once for all of them: the split-KV path of prefill
 * rows) against CPU_REFERENCE on fresh random hostile batches (permuted block table, NaN in
 * unread slots, outputs poisoned): chunked prefills with context, requests whose row counts are
 * not a multiple of the tokens a workgroup (their last row repeated), a decode row, an empty
 * request; window, soft cap, ALiBi, sinks and LSE; f16 / fp8 / bf16 / f32 caches, NHD and HND;
 * the plain and the transposed sums; direct rows and the fused reduce. The plan's counts prove
 * which path ran, and where the tokens are refused (rows cut into several slices, decode steps
 * whose padding would double the work) the plan says 1.
 * @module
 */
import assert from "node:assert/strict";
import { type DecodeTuning, makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import type { AttentionBackend } from "../../core/types.ts";
import type { BatchSpec, RequestSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import {
  BF16_NHD_SPEC,
  decodePlanInfo,
  F16_NHD_SPEC,
  F32_MHA_SPEC,
  FP8_HND_SPEC,
  ONE_SLICE_TUNING,
} from "../support/decode_knob_specs.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";
import { isSoftware } from "../../backends/decode_shape.ts";
import { longestFirst, tokenGroups } from "../../backends/decode_rows.ts";
import { makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import {
  PREFILL_GPU_KEYS_PER_ITER,
  PREFILL_GPU_TUNING,
  PREFILL_WG_TOKENS,
} from "../../backends/prefill_split_tuning.ts";

const BASE = ONE_SLICE_TUNING;

const backendOf = (t: Partial<DecodeTuning>) =>
  makeWebGpuDecode({ ...BASE, ...t }) as AttentionBackend;

/** Prefill chunks with context (9 and 5 rows: padded), a long one, an empty request: 30 rows,
 * 32 padded to pairs, 36 to fours (both within a quarter); 5 rows are fewer than 8. */
const PREFILL: RequestSpec[] = [
  { query_len: 9, seq_len: 60 },
  { query_len: 16, seq_len: 300, pad: 1 },
  { query_len: 0, seq_len: 9 },
  { query_len: 5, seq_len: 5 },
];

const F16: BatchSpec = { ...F16_NHD_SPEC, requests: PREFILL };
const FP8: BatchSpec = { ...FP8_HND_SPEC, requests: PREFILL };
const BF16: BatchSpec = { ...BF16_NHD_SPEC, requests: PREFILL };
const F32: BatchSpec = { ...F32_MHA_SPEC, requests: PREFILL };

/** What WEBGPU_FLASH's prefill rows on the split-KV kernels take on a GPU (prefillSplitTuning). */
const GPU_PREFILL: Partial<DecodeTuning> = {
  ...PREFILL_GPU_TUNING,
  scatter_sums: true,
  scatter_softmax: true,
  wg_tokens: PREFILL_WG_TOKENS,
  keys_per_iter: PREFILL_GPU_KEYS_PER_ITER,
};

/** Name, tuning, batch, tokens a workgroup expected. */
const CASES: [string, Partial<DecodeTuning>, BatchSpec, number][] = [
  ["2 tokens, direct rows: f16 NHD, window, sinks, ALiBi, cap, LSE", { wg_tokens: 2 }, F16, 2],
  [
    "4 tokens, transposed sums and softmax, fused reduce: f16 NHD",
    { wg_tokens: 4, scatter_sums: true, scatter_softmax: true, fused_reduce: true },
    F16,
    4,
  ],
  [
    "2 tokens, fused reduce, fp8 pairs: fp8 e4m3 HND scaled",
    { wg_tokens: 2, fused_reduce: true, fp8_pairs: true },
    FP8,
    2,
  ],
  [
    "4 tokens, transposed sums: bf16 hd64 GQA 8",
    { wg_tokens: 4, scatter_sums: true, scatter_softmax: true },
    BF16,
    4,
  ],
  [
    "2 tokens, early values off: f32 MHA, ALiBi, window",
    {
      wg_tokens: 2,
      early_values: false,
    },
    F32,
    2,
  ],
  [
    "4 tokens, 4 lanes a key row (two key groups a subgroup, as 16 of 32 on NVIDIA): f16 NHD",
    { wg_tokens: 4, max_lanes: 4, scatter_sums: true, scatter_softmax: true, fused_reduce: true },
    F16,
    4,
  ],
  [
    "4 tokens, transposed sums, 8 keys a step (the GPU prefill rows' tuning): f16 NHD",
    { wg_tokens: 4, scatter_sums: true, scatter_softmax: true, keys_per_iter: 8 },
    F16,
    4,
  ],
  [
    "4 tokens, transposed sums, 8 keys a step: f32 MHA, ALiBi, window",
    { wg_tokens: 4, scatter_sums: true, scatter_softmax: true, keys_per_iter: 8 },
    F32,
    4,
  ],
  [
    "4 tokens, the GPU prefill rows' tuning, longest groups first: f16 NHD",
    {
      wg_tokens: 4,
      scatter_sums: true,
      scatter_softmax: true,
      keys_per_iter: 8,
      longest_first: true,
    },
    F16,
    4,
  ],
  [
    "2 tokens, fused reduce, longest groups first: fp8 e4m3 HND scaled",
    { wg_tokens: 2, fused_reduce: true, longest_first: true },
    FP8,
    2,
  ],
  ["1 token, longest rows first: f32 MHA, ALiBi, window", { longest_first: true }, F32, 1],
  ["4 tokens, the GPU prefill rows' whole tuning: f16 NHD", GPU_PREFILL, F16, 4],
  ["4 tokens, the GPU prefill rows' whole tuning: bf16 hd64 GQA 8", GPU_PREFILL, BF16, 4],
  ["4 tokens, the GPU prefill rows' whole tuning: fp8 e4m3 HND scaled", GPU_PREFILL, FP8, 4],
  [
    "4 tokens, the GPU prefill rows' tuning with the GQA group tiled by 4 heads: bf16 hd64 GQA 8",
    { ...GPU_PREFILL, max_heads: 4 },
    BF16,
    4,
  ],
  [
    "4 tokens, tiled by 4 heads, the old sums (fma_dots off): bf16 hd64 GQA 8",
    { ...GPU_PREFILL, max_heads: 4, fma_dots: false },
    BF16,
    4,
  ],
  ["8 asked: a request of 5 rows, so 1", { wg_tokens: 8 }, F16, 1],
  [
    "with stage_kv and stage_table (both off then)",
    {
      wg_tokens: 2,
      stage_kv: true,
      stage_table: true,
    },
    FP8,
    2,
  ],
];

for (const [name, tuning, spec, wt] of CASES) {
  Deno.test(`decode wg_tokens: ${name}`, { ignore: NO_GPU }, async () => {
    const b = backendOf(tuning);
    const info = await planInfo(b, spec);
    const what = JSON.stringify(info);
    assert.equal(info.decode_wg_tokens, wt, what);
    assert.equal(info.decode_longest_first, tuning.longest_first ? 1 : 0, what);
    assert.equal(info.decode_split_rows, 0, `every row one slice (${what})`);
    if (wt > 1) {
      assert.equal(info.decode_staged_kv, 0, `no staged tile (${what})`);
      assert.equal(info.decode_table_entries, 0, `no staged table (${what})`);
      assert.ok(info.decode_workgroups * wt >= info.decode_rows, what);
    }
    await checkBackend(b, GPU!, spec);
  });
}

const planInfo = (b: AttentionBackend, s: BatchSpec) => decodePlanInfo(GPU!, b, s);

Deno.test("decode fma_dots: the planned kernel says which sums it runs (on by default)", {
  ignore: NO_GPU,
}, async () => {
  for (
    const [t, want] of [[{}, /decode_split\([^)]*,fma=true,/], [
      { fma_dots: false },
      /,fma=false,/,
    ]] as const
  ) {
    await checkBackend(backendOf({ ...GPU_PREFILL, ...t }), GPU!, F16, { kernels: want });
  }
});

Deno.test("decode wg_tokens: refused for rows of several slices", { ignore: NO_GPU }, async () => {
  const b = backendOf({
    wg_tokens: 2,
    min_split_keys: 16,
    target_workgroups: 4096,
    wave_workgroups: 528,
  });
  const info = await planInfo(b, F16);
  assert.ok(info.decode_split_rows > 0, JSON.stringify(info));
  assert.equal(info.decode_wg_tokens, 1, JSON.stringify(info));
  await checkBackend(b, GPU!, F16);
});

Deno.test("decode wg_tokens: a decode row beside prefill chunks keeps 1", {
  ignore: NO_GPU,
}, async () => {
  const spec: BatchSpec = { ...F16, requests: [...PREFILL, { query_len: 1, seq_len: 50 }] };
  const info = await planInfo(backendOf({ wg_tokens: 2 }), spec);
  assert.equal(info.decode_wg_tokens, 1, JSON.stringify(info));
});

Deno.test("decode wg_tokens: the padding is held to a quarter of the rows", () => {
  const rows = (lens: number[]) => ({
    count: lens.reduce((a, b) => a + b, 0),
    req: lens.flatMap((n, i) => Array(n).fill(i)),
  });
  assert.deepEqual(tokenGroups(rows([3, 2]), 2), [0, 1, 2, 2, 3, 4]);
  assert.equal(tokenGroups(rows([5, 5]), 4), null, "16 for 10 rows");
  assert.equal(tokenGroups(rows([9, 16, 5]), 4)?.length, 36);
  assert.equal(tokenGroups(rows([9, 1]), 2), null, "a request of one row");
  assert.equal(tokenGroups(rows([8]), 1), null);
});

Deno.test("decode longest_first: each request's groups from the longest, requests in place", () => {
  // Two requests: 5 rows (spans ascending, padded to 6 in pairs), then 3 rows of a window
  // (equal spans: kept as they came).
  const req = [0, 0, 0, 0, 0, 1, 1, 1];
  const span = [1, 2, 3, 4, 5, 8, 8, 8];
  const grouped = [0, 1, 2, 3, 4, 4, 5, 6, 7, 7];
  assert.deepEqual(longestFirst(grouped, 2, req, span), [4, 4, 2, 3, 0, 1, 5, 6, 7, 7]);
  assert.deepEqual(longestFirst([0, 1, 2, 3, 4, 5, 6, 7], 1, req, span), [
    4,
    3,
    2,
    1,
    0,
    5,
    6,
    7,
  ]);
});

Deno.test("decode longest_first: rows cut into several slices", { ignore: NO_GPU }, async () => {
  const b = backendOf({
    longest_first: true,
    min_split_keys: 16,
    target_workgroups: 4096,
    wave_workgroups: 528,
  });
  const info = await planInfo(b, F16);
  assert.ok(info.decode_split_rows > 0, JSON.stringify(info));
  assert.equal(info.decode_longest_first, 1, JSON.stringify(info));
  await checkBackend(b, GPU!, F16);
});

Deno.test("decode wg_tokens: a decode step keeps 1 token a workgroup", {
  ignore: NO_GPU,
}, async () => {
  const spec: BatchSpec = {
    ...F16,
    requests: [{ query_len: 1, seq_len: 80 }, { query_len: 1, seq_len: 33 }],
  };
  const info = await planInfo(backendOf({ wg_tokens: 2 }), spec);
  assert.equal(info.decode_wg_tokens, 1, JSON.stringify(info));
});

Deno.test("decode wg_tokens: WEBGPU_FLASH's prefill rows on the split-KV kernels take 4", {
  ignore: NO_GPU,
}, async () => {
  // The GPU kernel shape on lavapipe (the software one has one key group: 1 token). The
  // tensor cores off: where they would take the prefill rows this test returned before, its
  // checks unrun.
  const b = makeWebGpuFlash({ tile: null, decode: BASE, mma: false }) as AttentionBackend;
  const info = await planInfo(b, F16);
  assert.equal(info.prefill_tiles, 0, `the split-KV kernels take the prefill rows`);
  assert.equal(info.decode_wg_tokens, PREFILL_WG_TOKENS, JSON.stringify(info));
  // Longest rows first on GPU adapters (PREFILL_GPU_TUNING); a software adapter keeps the order.
  assert.equal(info.decode_longest_first, isSoftware(GPU!) ? 0 : 1, JSON.stringify(info));
  await checkBackend(b, GPU!, F16);
  await checkBackend(b, GPU!, BF16);
  // Forced on, WEBGPU_FLASH's plan says so too (the review of session 34: its info left it out).
  const lf = makeWebGpuFlash({ tile: null, decode: { ...BASE, longest_first: true }, mma: false });
  const on = await planInfo(lf as AttentionBackend, F16);
  assert.equal(on.decode_longest_first, 1, JSON.stringify(on));
  await checkBackend(lf as AttentionBackend, GPU!, F16);
});

Deno.test(
  "decode wg_tokens: WEBGPU_FLASH's mixed batch: decode rows in their own dispatch, prefill rows take 4",
  {
    ignore: NO_GPU,
  },
  async () => {
    // A decode row beside the prefill chunks: before v0.23 one dispatch ran both, with 1 token a
    // workgroup; now the decode rows go first with the decode tuning, the prefill rows after them.
    const b = makeWebGpuFlash({ tile: null, decode: BASE, mma: false }) as AttentionBackend;
    for (const base of [F16, BF16]) {
      const spec: BatchSpec = {
        ...base,
        // A speculative step of 3 rows goes with the decode rows (beside the long ones it
        // would cost them their 4 tokens).
        requests: [
          { query_len: 1, seq_len: 50 },
          ...PREFILL,
          { query_len: 1, seq_len: 7 },
          { query_len: 3, seq_len: 20 },
        ],
      };
      const info = await planInfo(b, spec);
      const what = JSON.stringify(info);
      assert.equal(info.prefill_tiles, 0, what);
      assert.equal(info.decode_dispatches, 2, what);
      assert.equal(info.decode_wg_tokens, PREFILL_WG_TOKENS, what);
      assert.equal(info.decode_rows, 2 + 30 + 3, what);
      await checkBackend(b, GPU!, spec);
    }
  },
);
