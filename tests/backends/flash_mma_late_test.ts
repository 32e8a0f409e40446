/**
 * The subgroup-matrix prefill kernel with its next-tile stores late (gpu/flash_mma_shape.ts
 * `late`, variants `-l`: the next tile's K/V words and the block ids two tiles ahead loaded at
 * the top of a tile, stored just before its closing barrier) against CPU_REFERENCE on fresh
 * random batches whose cache holds NaN in every slot no request may read: long contexts over
 * many small blocks (every tile's block ids come from the late store), partial last tiles,
 * padding, bf16 HND and fp8 caches, matrix-move staging; and what the shape changes in the
 * source. The GPU cases need a Dawn device with `chromium-experimental-subgroup-matrix`
 * (skipped with the reason elsewhere). Run with --allow-all.
 * @module
 */
import assert from "node:assert/strict";
import { MMA_VARIANTS, type MmaShape } from "../../gpu/flash_mma_shape.ts";
import type { BatchSpec } from "../support/batches.ts";
import {
  base,
  BF16_HND_ALL,
  FP8_NON_CAUSAL,
  keyLoopOf,
  LONG_CONTEXT_8_SLOT,
  mmaCaseTests,
  mmaSourceText,
  mmaTestDevice,
} from "../support/mma_case.ts";

const ctx = await mmaTestDevice("flash_mma late tests");

const CASES: [string, BatchSpec, MmaShape][] = [
  [
    "late + fast: causal f16 GQA4, long context over 8-slot blocks, padding, partial tiles",
    LONG_CONTEXT_8_SLOT,
    { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, late: true },
  ],
  [
    "late, generic softmax, tau 0: HND bs32 bf16 cache, window, soft cap, sinks, ALiBi",
    BF16_HND_ALL,
    { nsg: 2, rm: 1, bk: 16, tau: 0, late: true },
  ],
  [
    "late + fast: non-causal fp8 e4m3 cache, 32-key tiles",
    FP8_NON_CAUSAL,
    { nsg: 2, rm: 1, bk: 32, tau: 8, fast: true, late: true },
  ],
  [
    "late + fast + matrix staging: causal f16, context",
    base({ requests: [{ query_len: 30, seq_len: 100 }, { query_len: 5, seq_len: 21 }] }),
    { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true, mstage: true, late: true },
  ],
];

mmaCaseTests(ctx, CASES);

Deno.test("flash_mma: late moves the next tile's stores after PV, loads stay at the top", async () => {
  const src = (name: string) => mmaSourceText(MMA_VARIANTS[name]);
  const [dflt, late] = await Promise.all([src("w8r1k16-f"), src("w8r1k16-fl")]);
  const loop = keyLoopOf;
  const pv = (s: string) => loop(s).indexOf("o_0_0 = subgroupMatrixMultiplyAccumulate(");
  const at = (s: string, what: string) => {
    const i = loop(s).indexOf(what);
    assert.ok(i >= 0, `the loop holds ${what}`);
    return i;
  };
  for (const s of [dflt, late]) {
    assert.ok(at(s, "wk0 = src_k(") < at(s, "s_0_0_0 = subgroupMatrixMultiplyAccumulate("));
  }
  assert.ok(at(dflt, "kt_s[kbn + o + 0u]") < pv(dflt));
  assert.ok(at(late, "kt_s[kbn + o + 0u]") > pv(late));
  // Block ids come from the table in each staging lane's load (no workgroup copy of them).
  for (const s of [dflt, late]) assert.equal(s.indexOf("s_blk"), -1);
});
