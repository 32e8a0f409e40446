/**
 * The tensor-core prefill kernel and non-finite values of keys a row cannot see: P V on
 * subgroup matrices multiplies a whole V tile by each row's p, 0 for an invisible key, and
 * 0 x Inf is NaN. Before gpu/flash_mma_specials.ts the rows beside the causal diagonal and past
 * a window's start answered NaN where float64 is finite (bench/NOTES.md v0.23: the H100's run
 * of decode_masked_keys_test.ts failed its bf16 and window cases on Dawn). Against CPU_REFERENCE
 * (NaN and infinities where float64 has them, within tolerance elsewhere; output and LSE), for
 * the default shapes (16-byte and 4-byte output stores), the generic softmax, direct loads,
 * matrix staging, the D split, the pipelined loop and its staggered subgroups:
 * - bf16 data over an f16 cache, a later token's values past f16's range (Inf once written):
 *   +Inf alone, +Inf and -Inf in one column (NaN for the rows that see both), -Inf alone, and
 *   -Inf beside a context +Inf (one multiplied, one repaired), on a diagonal tile below kv_len;
 * - NaN in K and V in a context slot before the window of some rows (imported bytes).
 * The GPU cases need a Dawn device with `chromium-experimental-subgroup-matrix` (skipped with
 * the reason elsewhere). Run with --allow-all.
 * @module
 */
import { planFlashMma } from "../../backends/flash_mma_plan.ts";
import { MMA_SHAPES, MMA_VARIANTS, type MmaShape } from "../../gpu/flash_mma_shape.ts";
import { runGpuPlan } from "../../gpu/gpu_plan.ts";
import { type BatchSpec, generateBatch, type GeneratedBatch } from "../support/batches.ts";
import { freshSeed, mmaTestDevice, mmaTolerance } from "../support/mma_case.ts";
import {
  checkNonFinite,
  OVERFLOW_SPEC,
  plantCacheBits,
  plantCacheNaN,
  type Runner,
  WINDOWED_SPEC,
} from "../support/nonfinite.ts";
import type { MmaContext } from "../../gpu/flash_mma_device.ts";

const ctx = await mmaTestDevice("flash_mma masked-values tests");

const SHAPES: [string, MmaShape][] = [
  ["the default shape", MMA_SHAPES[0]],
  ["4-byte output stores", MMA_SHAPES[1]],
  ["generic softmax", MMA_VARIANTS["w8r1k16"]],
  ["direct loads", MMA_VARIANTS["w8r1k16-fd"]],
  ["matrix staging", MMA_VARIANTS["w8r1k16-fx"]],
  ["D split", MMA_VARIANTS["w8r1k16-fld"]],
  ["the pipelined loop", MMA_VARIANTS["w8r1k16-fvri"]],
  ["staggered subgroups", MMA_VARIANTS["w8r1k16-fvrg"]],
];

/** The kernel alone with `shape`, planned and run through the shared launch path. */
function mmaRunner(c: MmaContext, shape: MmaShape, spec: BatchSpec): Runner {
  return {
    ctx: c,
    run: async (batch) => runGpuPlan(await planFlashMma(c, batch, c.mma, shape), batch, c),
    tol: mmaTolerance(spec),
    lseTol: { atol: 1e-3, rtol: 1e-4 },
  };
}

/** bf16 data over an f16 cache (the tensor cores take f16 and bf16 data only). */
const OVERFLOW: BatchSpec = {
  ...OVERFLOW_SPEC,
  dtype: "bfloat16",
  // Request 0's chunk at positions 32-51: its diagonal tile 32-47 ends below kv_len (a tile
  // direct loads read from the cache and matrix staging moves whole, unless not seen whole).
  requests: [{ query_len: 20, seq_len: 52 }, { query_len: 9, seq_len: 40 }],
};

/** 99840 (a bf16 value) at `tok`'s kv head 1 element `e` of request 0, signed: Inf in f16. */
function plantOverflow(g: GeneratedBatch, tok: number, e: number, sign: number): void {
  const v = g.batch.value as unknown as Float32Array;
  v[tok * 2 * 64 + 64 + e] = sign * 99840;
}

for (const [name, shape] of SHAPES) {
  const opts = { ignore: ctx === null, sanitizeOps: false, sanitizeResources: false };
  Deno.test(
    `flash_mma masked values: later tokens' values past f16's range, ${name}`,
    opts,
    async () => {
      const g = generateBatch(OVERFLOW, freshSeed());
      // Column 7: +Inf from token 5, -Inf from token 7 (rows 5-6 +Inf, 7-19 NaN); column 9:
      // -Inf from token 3 (rows before it see none). Column 11: +Inf in the context at position
      // 2 (a tile every row sees whole: +Inf through the multiply) and -Inf from token 6 (a
      // repaired one): rows 0-5 +Inf, 6-19 NaN.
      plantOverflow(g, 5, 7, 1);
      plantOverflow(g, 7, 7, -1);
      plantOverflow(g, 3, 9, -1);
      plantOverflow(g, 6, 11, -1);
      plantCacheBits(g, [g.value_cache], [0, 2, 1, 11], 0x7c00);
      const { odd } = await checkNonFinite(g, mmaRunner(ctx!, shape, OVERFLOW), name);
      if (odd === 0) throw new Error("the planted values reached no row: the case tests nothing");
    },
  );
  Deno.test(
    `flash_mma masked values: NaN in a context slot before the window, ${name}`,
    opts,
    async () => {
      const g = generateBatch(WINDOWED_SPEC, freshSeed());
      plantCacheNaN(g, 0, 9); // queries at 10-13 see 8-10 .. 11-13
      plantCacheNaN(g, 1, 17); // its query at 22 sees 20-22
      await checkNonFinite(g, mmaRunner(ctx!, shape, WINDOWED_SPEC), name);
    },
  );
}
