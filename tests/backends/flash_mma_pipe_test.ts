/**
 * The subgroup-matrix prefill kernel with its key loop pipelined (gpu/flash_mma_shape.ts `pipe`,
 * gpu/flash_mma_loop.ts: a tile's O += P V runs in the next step beside that step's S = Q K^T,
 * one step past the last tile runs the last PV, three barriers a tile) against CPU_REFERENCE on
 * fresh random batches whose cache holds NaN in every slot no request may read: tau 0 (a lazy
 * rescale of O on nearly every tile, applied one step late), long contexts over small blocks,
 * partial last tiles, padding, a one-token request, every feature over a bf16 HND cache, a scaled
 * fp8 cache with 32-key tiles, GQA 8; and what the shape changes in the source. The GPU cases need
 * a Dawn device with `chromium-experimental-subgroup-matrix` (skipped with the reason elsewhere).
 * Run with --allow-all.
 * @module
 */
import assert from "node:assert/strict";
import { MMA_VARIANTS, type MmaShape, mmaShapeProblem } from "../../gpu/flash_mma_shape.ts";
import {
  H200_F16_TARGET,
  keyLoopOf,
  loopFormCases,
  mmaCaseTests,
  mmaSourceText,
  mmaTestDevice,
} from "../support/mma_case.ts";

const ctx = await mmaTestDevice("flash_mma pipe tests");

const PIPE: MmaShape = MMA_VARIANTS["w8r1k16-fvri"];

const CASES = loopFormCases("pipe", { pipe: true }, PIPE);

mmaCaseTests(ctx, CASES);

/** The key loop of the named shape's source for the H200's dims, comments dropped. */
const loopOf = async (name: string) => keyLoopOf(await mmaSourceText(MMA_VARIANTS[name]));

Deno.test("flash_mma: pipe runs a tile's PV in the next step, before its QK, 3 barriers", async () => {
  const [inOrder, pipe] = await Promise.all([loopOf("w8r1k16-flvr"), loopOf("w8r1k16-fvri")]);
  const at = (s: string, what: string) => {
    const i = s.indexOf(what);
    assert.ok(i >= 0, `the loop holds ${what}`);
    return i;
  };
  const qk = "s_0_0_0 = subgroupMatrixMultiplyAccumulate(";
  const pv = "o_0_0 = subgroupMatrixMultiplyAccumulate(";
  assert.ok(at(inOrder, qk) < at(inOrder, pv));
  assert.ok(at(pipe, pv) < at(pipe, qk));
  assert.match(pipe, /for \(var kt = kstart; kt < kend \+ BK; kt \+= BK\) \{/);
  assert.match(pipe, /if \(live_prev\) \{\n\s+let kb = \(par \^ 1u\) \* KT_LEN;/);
  // The flag's uniform load heads the step, before the previous PV; the next tile's stores
  // follow the softmax.
  assert.ok(at(pipe, "workgroupUniformLoad(&s_u[2])") < at(pipe, pv));
  assert.ok(at(pipe, "kt_s[kbn + o + 0u]") > at(pipe, "exp2("));
  // Written barriers outside the rescale block (which has 3 per O pass in both): in order S and
  // the closing one (+ the uniform load's two); pipelined S only (+ the uniform load's two).
  const outside = (s: string) => {
    const a = s.indexOf("if (resc != 0u) {");
    const b = s.indexOf("\n    }\n", a);
    return s.slice(0, a) + s.slice(b);
  };
  const barriers = (s: string) => (outside(s).match(/workgroupBarrier\(\)/g) ?? []).length;
  assert.equal(barriers(inOrder), 2);
  assert.equal(barriers(pipe), 1);
});

Deno.test("flash_mma: pipe refuses the shapes it cannot pipeline, naming why", () => {
  const t = { ...H200_F16_TARGET, causal: true, window: false };
  const why = "pipe needs staged tiles, the workgroup's rescale flag, dsplit 1 and no late stores";
  for (const extra of [{ direct: true }, { mstage: true }, { sgresc: true }, { late: true }]) {
    assert.equal(mmaShapeProblem(t, { ...PIPE, ...extra }), why, JSON.stringify(extra));
  }
  assert.equal(mmaShapeProblem(t, { ...PIPE, nsg: 8, dsplit: 2 }), why);
  assert.match(mmaShapeProblem(t, { ...PIPE, ablate: "count" }) ?? "", /no count cut/);
  assert.equal(mmaShapeProblem(t, PIPE), null);
});
