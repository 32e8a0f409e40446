/**
 * The subgroup-matrix prefill kernel's v0.6 shapes: K/V tiles staged by matrix moves
 * (gpu/flash_mma_shape.ts `mstage`: `subgroupMatrixLoad` from the f16 cache, then
 * `subgroupMatrixStore` into the workgroup tiles; a tile crossing the request's end copied
 * element by element, zero past the visible keys) against CPU_REFERENCE on fresh random batches
 * whose cache holds NaN in every slot no request may read: context, padding, partial last tiles,
 * HND with 32-slot blocks, window, soft cap, sinks, LSE, 2 row blocks; S = Q K^T in two
 * independent chains (`qsplit`) on a non-causal bf16 cache with ALiBi (the fast softmax's
 * kend-only masks); and the reasons a target refuses them. The GPU cases need a Dawn device with `chromium-experimental-subgroup-matrix`
 * (skipped with the reason elsewhere). Run with --allow-all.
 */
import assert from "node:assert/strict";
import {
  MMA_VARIANTS,
  type MmaShape,
  mmaShapeProblem,
  type MmaTarget,
} from "../../gpu/flash_mma_shape.ts";
import type { BatchSpec } from "../support/batches.ts";
import { base, H200_F16_TARGET, mmaCaseTests, mmaTestDevice } from "../support/mma_case.ts";

const ctx = await mmaTestDevice("flash_mma matrix-staging tests");

const CASES: [string, BatchSpec, MmaShape][] = [
  [
    "mstage + fast: causal f16 GQA4, context, padding, partial last tiles",
    base({
      requests: [
        { query_len: 40, seq_len: 75 },
        { query_len: 1, seq_len: 33 },
        { query_len: 17, seq_len: 17, pad: 2 },
      ],
    }),
    { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, mstage: true },
  ],
  [
    "mstage, generic softmax, rm2: HND bs32 window, soft cap, sinks",
    base({
      layout: "HND",
      block_size: 32,
      sliding_window: 30,
      logits_soft_cap: 10,
      sinks: true,
      requests: [{ query_len: 45, seq_len: 100 }, { query_len: 3, seq_len: 20 }],
    }),
    { nsg: 2, rm: 2, bk: 16, tau: 8, mstage: true },
  ],
  [
    "qsplit 2 + fast: non-causal decoder, bf16 cache, ALiBi (only kend masks)",
    base({
      causal: false,
      kv_cache_dtype: "bfloat16",
      alibi: true,
      requests: [{ query_len: 30, seq_len: 64 }, { query_len: 1, seq_len: 7 }],
    }),
    { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, qsplit: 2 },
  ],
];

mmaCaseTests(ctx, CASES);

Deno.test("flash_mma: matrix staging says why a target cannot take it", () => {
  const t: MmaTarget = { ...H200_F16_TARGET };
  const fx = MMA_VARIANTS["w8r1k16-fx"];
  assert.equal(mmaShapeProblem(t, fx, 49152), null);
  assert.match(String(mmaShapeProblem({ ...t, kv: "fp8_e4m3" }, fx)), /f16 cache, not fp8_e4m3/);
  assert.match(String(mmaShapeProblem({ ...t, enc: true }, fx)), /f16 cache/);
  assert.match(String(mmaShapeProblem({ ...t, nchunk: 3 }, fx)), /one cache buffer, not 3/);
  assert.match(String(mmaShapeProblem({ ...t, bs: 8 }, fx)), /block_size 8 a multiple of 16/);
  assert.match(String(mmaShapeProblem(t, { ...fx, qsplit: 3 })), /qsplit 3 is not 1, 2 or 4/);
  assert.match(String(mmaShapeProblem(t, { ...fx, direct: true })), /exclude each other/);
  assert.equal(mmaShapeProblem({ ...t, bs: 32, nhd: false }, MMA_VARIANTS["w4r1k32-fx"]), null);
});
