/**
 * The subgroup-matrix prefill kernel with its subgroups staggered (gpu/flash_mma_shape.ts
 * `stagger`, gpu/flash_mma_loop.ts: the pipelined loop with the second half of the subgroups a
 * phase behind the first, P in buffers of its own, V in three, each half's rescale flag a bit of
 * one word) against CPU_REFERENCE on fresh random batches whose cache holds NaN in every slot no
 * request may read: tau 0 (a rescale on nearly every tile, for each half on its own step), long
 * contexts over small blocks, partial last tiles, padding, one-token and one-tile requests, every
 * feature over a bf16 HND cache, a scaled fp8 cache with 32-key tiles, two row blocks a subgroup;
 * and what the shape changes in the source and the layout. The GPU cases need a Dawn device with
 * `chromium-experimental-subgroup-matrix` (skipped with the reason elsewhere). Run with
 * --allow-all.
 * @module
 */
import assert from "node:assert/strict";
import {
  MMA_VARIANTS,
  mmaLayout,
  type MmaShape,
  mmaShapeProblem,
} from "../../gpu/flash_mma_shape.ts";
import {
  checkMma,
  GQA8_TWO_BLOCKS,
  H200_F16_TARGET,
  keyLoopOf,
  loopFormCases,
  mmaCaseTests,
  mmaSourceText,
  mmaTestDevice,
} from "../support/mma_case.ts";

const ctx = await mmaTestDevice("flash_mma stagger tests");

const STAGGER: MmaShape = MMA_VARIANTS["w8r1k16-fvrg"];

const CASES = loopFormCases("stagger", { stagger: true }, STAGGER);

mmaCaseTests(ctx, CASES);

Deno.test({
  name: "flash_mma stagger: a subgroup that skips a tile does not rescale with an old alpha",
  ignore: ctx === null,
  sanitizeOps: false,
  sanitizeResources: false,
  // The first version cleared a lane's alphas only where its subgroup ran the tile: with this
  // batch (GQA 8, two row blocks a subgroup, tau 0) a subgroup of the second half past the
  // causal edge rescaled with its last alpha when another subgroup of its half set the half's
  // flag (45 of 35840 elements out of tolerance on lavapipe, 7.9x at worst).
  fn: () =>
    checkMma(ctx!, GQA8_TWO_BLOCKS, 2913057980, {
      shape: { nsg: 4, rm: 2, bk: 16, tau: 0, fast: true, stagger: true },
    }),
});

/** The key loop of `shape`'s source for the H200's dims, comments dropped. */
const loopOf = async (shape: MmaShape) => keyLoopOf(await mmaSourceText(shape));

Deno.test("flash_mma: stagger puts one half's matrix work beside the other's softmax", async () => {
  const loop = await loopOf(STAGGER);
  const bar = loop.indexOf("workgroupBarrier();\n    if (half == 0u) {");
  assert.ok(bar > 0, "the phase barrier");
  const [x, y] = [loop.slice(0, bar), loop.slice(bar)];
  const count = (s: string, what: string) => s.split(what).length - 1;
  // Phase X: the first half's PV and QK, the second half's PV and softmax; phase Y: the first
  // half's softmax and the second half's QK. One copy of each matrix product a half.
  assert.equal(count(x, "o_0_0 = subgroupMatrixMultiplyAccumulate("), 2);
  assert.equal(count(x, "var s_0_0_0 = "), 1);
  assert.equal(count(x, "atomicOr(&s_u[2], flag_bit)"), 1);
  assert.equal(count(y, "o_0_0 = subgroupMatrixMultiplyAccumulate("), 0);
  assert.equal(count(y, "var s_0_0_0 = "), 1);
  assert.equal(count(y, "atomicOr(&s_u[2], flag_bit)"), 1);
  assert.match(loop, /for \(var kt = kstart; kt < kend \+ 2u \* BK; kt \+= BK\) \{/);
  // Barriers outside the rescale block: the phase's (+ the uniform load's two).
  const a = loop.indexOf("if (resc_a || resc_b) {");
  const b = loop.indexOf("\n    }\n", a);
  const outside = loop.slice(0, a) + loop.slice(b);
  assert.equal(outside.split("workgroupBarrier()").length - 1, 1);
  assert.match(loop.slice(a, b), /if \(mine\) \{\n\s+scale_rows\(sgr \+ rsh, ln, alpha\);/);
});

Deno.test("flash_mma: stagger's layout fits the H200's 48 KB and refuses what it cannot run", () => {
  const t = { ...H200_F16_TARGET, causal: true, window: false };
  const lay = mmaLayout(t, STAGGER);
  // Two K tiles, P 64 + 2 x 64 rows, three V tiles, S and the second half's rescale rows.
  assert.equal(lay.ktDecl, 2 * 16 * 136 + 3 * 64 * 24);
  assert.equal(lay.vtBufs, 3);
  assert.equal(lay.sLen, 1.5 * 128 * 20);
  assert.ok(lay.shared_bytes <= 49152, `${lay.shared_bytes} B`);
  assert.equal(mmaShapeProblem(t, STAGGER, 49152), null);
  const why = "stagger needs an even nsg, staged tiles, one S chain and no other loop form";
  for (
    const extra of [{ nsg: 3 }, { direct: true }, { pipe: true }, { late: true }, { qsplit: 2 }]
  ) {
    assert.equal(mmaShapeProblem(t, { ...STAGGER, ...extra }), why, JSON.stringify(extra));
  }
  assert.equal(
    mmaShapeProblem(t, { ...STAGGER, oregions: 2 }),
    "stagger takes no oregions or ablation",
  );
});
