/** bench/mma_bench.ts's `--cases` names (bench/mma_bench_data.ts parseCase). */
import assert from "node:assert/strict";
import { parseCase, type PrefillCase } from "../../bench/mma_bench_data.ts";

const BASE: PrefillCase = {
  reqs: 4,
  len: 1024,
  heads: 32,
  kvHeads: 8,
  headSize: 128,
  blockSize: 16,
};

Deno.test("mma bench cases: causal, non-causal and other head counts; bad names are null", () => {
  assert.deepEqual(parseCase("8x4096", BASE), { ...BASE, reqs: 8, len: 4096, causal: true });
  assert.deepEqual(parseCase("4x4096n", BASE), { ...BASE, len: 4096, causal: false });
  assert.deepEqual(parseCase("2x1056n-h16k4", BASE), {
    ...BASE,
    reqs: 2,
    len: 1056,
    causal: false,
    heads: 16,
    kvHeads: 4,
  });
  for (const bad of ["", "8x", "x4096", "0x16", "2x16-h6k4", "2x16-h8k0", "2x16c", "2x16n-h8"]) {
    assert.equal(parseCase(bad, BASE), null, bad);
  }
});
