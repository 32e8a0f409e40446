/**
 * The subgroup-matrix prefill kernel's per-subgroup lazy rescale (gpu/flash_mma_shape.ts
 * `sgresc`, variants `-u`: the lanes' flags reduced by subgroupAny after a plain P barrier, the
 * O round trip through the subgroup's own rows of s_s with no workgroup barrier) against
 * CPU_REFERENCE on fresh random batches whose cache holds NaN in every slot no request may
 * read, both at tau 0 (a rescale on every new row max, so nearly every tile takes the path;
 * with the rescale cut out, the ALiBi batch still passed at tau 8): the fast softmax over
 * context and padding, the generic softmax with ALiBi and sinks; and what the shape changes in
 * the source (the default's protocol kept, the `-u` one without the atomic flag). The GPU cases
 * need a Dawn device with `chromium-experimental-subgroup-matrix` (skipped with the reason
 * elsewhere). Run with --allow-all.
 * @module
 */
import assert from "node:assert/strict";
import { MMA_VARIANTS, type MmaShape } from "../../gpu/flash_mma_shape.ts";
import type { BatchSpec } from "../support/batches.ts";
import {
  base,
  keyLoopOf,
  mmaCaseTests,
  mmaSourceText,
  mmaTestDevice,
} from "../support/mma_case.ts";

const ctx = await mmaTestDevice("flash_mma sgresc tests");

const CASES: [string, BatchSpec, MmaShape][] = [
  [
    "sgresc + fast, tau 0: causal f16 GQA4, context, padding, partial last tiles",
    base({
      requests: [
        { query_len: 40, seq_len: 100 },
        { query_len: 1, seq_len: 33 },
        { query_len: 17, seq_len: 17, pad: 2 },
      ],
    }),
    { nsg: 4, rm: 1, bk: 16, tau: 0, fast: true, sgresc: true },
  ],
  [
    "sgresc, generic softmax, tau 0: causal f16, ALiBi, sinks, long context",
    base({
      alibi: true,
      sinks: true,
      requests: [{ query_len: 20, seq_len: 120 }, { query_len: 3, seq_len: 40 }],
    }),
    { nsg: 2, rm: 1, bk: 16, tau: 0, sgresc: true },
  ],
];

mmaCaseTests(ctx, CASES);

Deno.test("flash_mma: sgresc drops the workgroup's rescale flag, the default keeps it", async () => {
  const src = (name: string) => mmaSourceText(MMA_VARIANTS[name]);
  const [dflt, fu] = await Promise.all([src("w8r1k16-f"), src("w8r1k16-fu")]);
  const loop = keyLoopOf;
  assert.match(loop(dflt), /workgroupUniformLoad\(&s_u\[2\]\)/);
  assert.match(loop(dflt), /atomicStore\(&s_u\[2\], 1u\)/);
  assert.doesNotMatch(loop(fu), /s_u\[2\]/);
  assert.match(loop(fu), /if \(subgroupAny\(resc_lane\)\) \{/);
  // Written barriers a tile: the default S, end and the rescale's 3 per O pass (its P barrier
  // is inside workgroupUniformLoad); sgresc S, P, end and none in the rescale.
  const barriers = (s: string) => (loop(s).match(/workgroupBarrier\(\)/g) ?? []).length;
  assert.equal(barriers(dflt), 2 + 3 * 8);
  assert.equal(barriers(fu), 3);
});
