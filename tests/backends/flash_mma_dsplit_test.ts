/**
 * The subgroup-matrix prefill kernel with D split over a pair of subgroups
 * (gpu/flash_mma_shape.ts `dsplit` 2, variants `-d`: each subgroup of a pair holds half of D in
 * its Q fragments and O accumulators, S comes in two partial products added by the softmax,
 * which both subgroups run, the first writing P and the LSE) against CPU_REFERENCE on fresh
 * random batches whose cache holds NaN in every slot no request may read: causal GQA with
 * context, padding and partial tiles at tau 0 (the O rescale of both halves on most tiles),
 * bf16 HND with every feature, an fp8 cache, 16 subgroups; and what the shape changes in the
 * source. The GPU cases need a Dawn device with `chromium-experimental-subgroup-matrix`
 * (skipped with the reason elsewhere). Run with --allow-all.
 * @module
 */
import assert from "node:assert/strict";
import { flashMmaSource } from "../../gpu/flash_mma_codegen.ts";
import {
  fullShape,
  MMA_VARIANTS,
  type MmaShape,
  mmaShapeProblem,
} from "../../gpu/flash_mma_shape.ts";
import type { BatchSpec } from "../support/batches.ts";
import {
  base,
  BF16_HND_ALL,
  FP8_NON_CAUSAL,
  H200_F16_TARGET,
  mmaCaseTests,
  mmaTestDevice,
} from "../support/mma_case.ts";

const ctx = await mmaTestDevice("flash_mma dsplit tests");

const CASES: [string, BatchSpec, MmaShape][] = [
  [
    "dsplit + fast + late, tau 0: causal f16 GQA4, context, padding, partial last tiles",
    base({
      requests: [
        { query_len: 40, seq_len: 130 },
        { query_len: 1, seq_len: 33 },
        { query_len: 17, seq_len: 17, pad: 2 },
      ],
    }),
    { nsg: 4, rm: 1, bk: 16, tau: 0, fast: true, late: true, dsplit: 2 },
  ],
  [
    "dsplit, generic softmax: HND bs32 bf16 cache, window, soft cap, sinks, ALiBi",
    BF16_HND_ALL,
    { nsg: 2, rm: 1, bk: 16, tau: 8, dsplit: 2 },
  ],
  [
    "dsplit + fast, 16 subgroups: non-causal fp8 e4m3 cache",
    FP8_NON_CAUSAL,
    { nsg: 16, rm: 1, bk: 16, tau: 8, fast: true, late: true, dsplit: 2 },
  ],
  [
    "dsplit + fast + late, 2 row blocks a subgroup, tau 0: causal f16 GQA4 with context",
    base({ requests: [{ query_len: 37, seq_len: 90 }, { query_len: 5, seq_len: 5 }] }),
    { nsg: 4, rm: 2, bk: 16, tau: 0, fast: true, late: true, dsplit: 2 },
  ],
];

mmaCaseTests(ctx, CASES);

Deno.test("flash_mma: dsplit halves each subgroup's fragments; one of a pair writes P and LSE", async () => {
  const t = { ...H200_F16_TARGET, causal: true, window: false };
  const src = async (name: string) =>
    (await flashMmaSource({ ...t, ...fullShape(MMA_VARIANTS[name]) } as never))
      .split("\n").filter((x) => !x.trimStart().startsWith("//")).join("\n");
  const [fl, fld] = await Promise.all([src("w8r1k16-fl"), src("w8r1k16-fld")]);
  const count = (s: string, re: RegExp) => (s.match(re) ?? []).length;
  assert.equal(count(fl, /var q_0_\d+:/g), 8);
  assert.equal(count(fld, /var q_0_\d+:/g), 4);
  assert.equal(count(fl, /var o_0_\d+ =/g), 8);
  assert.equal(count(fld, /var o_0_\d+ =/g), 4);
  assert.match(fld, /const R: u32 = MR \* NSG \/ 2u;/);
  assert.match(fld, /if \(dh == 0u\) \{\s*kt_s\[kb \+ pb \+ 0u\] = p0;/);
  assert.match(fld, /if \(rok\[i\] && lq == 0u && dh == 0u\)/);
  assert.match(fld, /write_rows\(sgr \+ dh \* R, ln, dq \+ 0u, tb, inv, 0u\)/);
  assert.doesNotMatch(fl, /\bdh\b/);
});

Deno.test("flash_mma: dsplit says which shapes cannot take it", () => {
  const t = { ...H200_F16_TARGET };
  const fld = MMA_VARIANTS["w8r1k16-fld"];
  assert.equal(mmaShapeProblem(t, fld, 49152), null);
  assert.match(String(mmaShapeProblem(t, { ...fld, nsg: 3 })), /even nsg/);
  assert.match(String(mmaShapeProblem(t, { ...fld, qsplit: 2 })), /one S chain/);
  assert.match(String(mmaShapeProblem(t, { ...fld, mstage: true })), /staged tiles/);
  assert.match(String(mmaShapeProblem({ ...t, d: 48 }, fld)), /unevenly/);
});
