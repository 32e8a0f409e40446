/**
 * The subgroup-matrix prefill kernel's v0.7 single-buffered shapes (gpu/flash_mma_shape.ts
 * `single`: one K and one V tile, P in its own array; the next tile's K stored after the S
 * barrier, its V at the top of the next tile) against CPU_REFERENCE on fresh random batches
 * whose cache holds NaN in every slot no request may read: 32-key tiles with the fast softmax
 * over context, padding and partial last tiles; the generic softmax on an HND bf16 cache with
 * window, soft cap, sinks and 2 row blocks; an fp8 cache with ALiBi, non-causal; and what the
 * shape changes in the memory a target needs. The GPU cases need a Dawn device with
 * `chromium-experimental-subgroup-matrix` (skipped with the reason elsewhere). Run with
 * --allow-all.
 * @module
 */
import assert from "node:assert/strict";
import { MMA_VARIANTS, mmaLayout, mmaShapeProblem } from "../../gpu/flash_mma_shape.ts";
import { acquireMmaDevice } from "../../gpu/flash_mma_device.ts";
import type { BatchSpec } from "../support/batches.ts";
import { base, H200_F16_TARGET, mmaCaseTests } from "../support/mma_case.ts";
import type { MmaShape } from "../../gpu/flash_mma_shape.ts";

const acquired = await acquireMmaDevice();
const ctx = acquired.ctx;
if (!ctx) console.warn(`flash_mma single-buffer tests skipped: ${acquired.reason}`);

const CASES: [string, BatchSpec, MmaShape][] = [
  [
    "single + fast, 32-key tiles: causal f16 GQA4, context, padding, partial last tiles",
    base({
      requests: [
        { query_len: 40, seq_len: 107 },
        { query_len: 1, seq_len: 33 },
        { query_len: 17, seq_len: 17, pad: 2 },
      ],
    }),
    { nsg: 4, rm: 1, bk: 32, tau: 8, fast: true, single: true },
  ],
  [
    "single, generic softmax, rm2: HND bs32 bf16 cache, window, soft cap, sinks",
    base({
      layout: "HND",
      block_size: 32,
      kv_cache_dtype: "bfloat16",
      sliding_window: 30,
      logits_soft_cap: 10,
      sinks: true,
      requests: [{ query_len: 45, seq_len: 100 }, { query_len: 3, seq_len: 20 }],
    }),
    { nsg: 2, rm: 2, bk: 16, tau: 8, single: true },
  ],
  [
    "single + fast: non-causal fp8 e4m3 cache, ALiBi",
    base({
      causal: false,
      kv_cache_dtype: "fp8_e4m3",
      alibi: true,
      requests: [{ query_len: 30, seq_len: 64 }, { query_len: 1, seq_len: 7 }],
    }),
    { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, single: true },
  ],
];

mmaCaseTests(ctx, CASES);

Deno.test("flash_mma: single buffers fit 8 subgroups of 32-key tiles on the H200's 48 KB", () => {
  const t = H200_F16_TARGET, fb = MMA_VARIANTS["w8r1k32-fb"];
  assert.equal(mmaShapeProblem(t, fb, 49152), null);
  assert.match(String(mmaShapeProblem(t, { ...fb, single: false }, 49152)), /needs 56\d+ B/);
  assert.equal(mmaLayout(t, fb).nbuf, 1);
  assert.equal(mmaLayout(t, MMA_VARIANTS["w8r1k16-f"]).nbuf, 2);
  assert.equal(mmaShapeProblem(t, MMA_VARIANTS["w2r1k64-fb"], 49152), null);
  assert.match(String(mmaShapeProblem(t, { ...fb, mstage: true })), /not with direct or mstage/);
  assert.match(String(mmaShapeProblem(t, { ...fb, direct: true })), /not with direct or mstage/);
});
