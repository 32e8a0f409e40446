/**
 * The subgroup-matrix prefill kernel's fast softmax (features compiled in, mask-free interior
 * tiles, exp2) and direct K/V loads from an f16 cache (gpu/flash_mma_shape.ts `fast`, `direct`)
 * against CPU_REFERENCE on fresh random batches: long prefills (mostly interior tiles) with
 * soft cap, ALiBi, sinks, causal and non-causal windows, LSE, fp8/bf16 caches, bf16 data, HND,
 * padding, an encoder type, 2 row blocks, tau 0; and the reasons a target refuses direct loads
 * or an ablation, and the ATTN_PREFILL_MMA_SHAPE switch. The GPU cases need a Dawn device with
 * `chromium-experimental-subgroup-matrix` (skipped with the reason elsewhere). Run with
 * --allow-all.
 */
import assert from "node:assert/strict";
import { envMmaShape, mmaConstsOf, MmaRefusal } from "../../backends/flash_mma_plan.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { GpuContext } from "../../core/types.ts";
import { validHostBatch } from "../../service/host_input.ts";
import {
  chooseMmaShape,
  MMA_SHAPES,
  MMA_VARIANTS,
  type MmaShape,
  mmaShapeProblem,
  type MmaTarget,
} from "../../gpu/flash_mma_shape.ts";
import { type BatchSpec, generateBatch } from "../support/batches.ts";
import { base, H200_F16_TARGET, mmaCaseTests, mmaTestDevice } from "../support/mma_case.ts";
import { withEnv } from "../support/env.ts";

const ctx = await mmaTestDevice("flash_mma fast/direct tests");

const SHAPES = {
  fast: { nsg: 4, rm: 1, bk: 16, tau: 8, fast: true },
  fastfa2: { nsg: 2, rm: 1, bk: 16, tau: 0, fast: true },
  fastrm2: { nsg: 2, rm: 2, bk: 16, tau: 8, fast: true },
  direct: { nsg: 4, rm: 1, bk: 16, tau: 8, direct: true },
  fastdirect: { nsg: 2, rm: 1, bk: 32, tau: 8, fast: true, direct: true },
} satisfies Record<string, MmaShape>;

// The fast and direct shapes run long prefills: most of their tiles are interior (every key
// visible to every row of a subgroup: the mask-free path), the rest boundary tiles.
const CASES: [string, BatchSpec, MmaShape][] = [
  [
    "fast: causal GQA4 long prefill, soft cap + ALiBi + sinks, interior tiles",
    base({
      logits_soft_cap: 8,
      alibi: true,
      sinks: true,
      q_std: 2,
      requests: [{ query_len: 70, seq_len: 90 }, { query_len: 1, seq_len: 40 }],
    }),
    SHAPES.fast,
  ],
  [
    "fast: causal window, fp8_e4m3 scaled, bf16 data HND, exact FA2 rescale",
    base({
      dtype: "bfloat16",
      kv_cache_dtype: "fp8_e4m3",
      layout: "HND",
      sliding_window: 40,
      k_scale: 0.5,
      v_scale: 2,
      requests: [{ query_len: 50, seq_len: 80 }, { query_len: 2, seq_len: 9 }],
    }),
    SHAPES.fastfa2,
  ],
  [
    "fast: encoder_only window ALiBi, rm2",
    base({
      attn_type: "encoder_only",
      sliding_window: 20,
      alibi: true,
      requests: [{ query_len: 37, seq_len: 37 }, { query_len: 60, seq_len: 60 }],
    }),
    SHAPES.fastrm2,
  ],
  [
    "fast: non-causal decoder, bf16 cache, no features",
    base({
      causal: false,
      kv_cache_dtype: "bfloat16",
      requests: [{ query_len: 30, seq_len: 64 }, { query_len: 1, seq_len: 7 }],
    }),
    SHAPES.fast,
  ],
  [
    "direct: causal f16 GQA4 with context and padding",
    base({
      requests: [
        { query_len: 40, seq_len: 75 },
        { query_len: 1, seq_len: 33 },
        { query_len: 17, seq_len: 17, pad: 2 },
      ],
    }),
    SHAPES.direct,
  ],
  [
    "direct + fast: HND bs32 window, soft cap, sinks, LSE",
    base({
      layout: "HND",
      block_size: 32,
      sliding_window: 30,
      logits_soft_cap: 10,
      sinks: true,
      requests: [{ query_len: 45, seq_len: 100 }, { query_len: 3, seq_len: 20 }],
    }),
    SHAPES.fastdirect,
  ],
];

mmaCaseTests(ctx, CASES);

Deno.test("flash_mma: direct loads and ablations say why a target cannot take them", () => {
  const t: MmaTarget = { ...H200_F16_TARGET };
  const fd = MMA_VARIANTS["w8r1k16-fd"];
  assert.equal(mmaShapeProblem(t, fd, 49152), null);
  assert.match(String(mmaShapeProblem({ ...t, kv: "bfloat16" }, fd)), /f16 cache, not bfloat16/);
  assert.match(String(mmaShapeProblem({ ...t, enc: true }, fd)), /f16 cache/);
  assert.match(String(mmaShapeProblem({ ...t, nchunk: 2 }, fd)), /one cache buffer, not 2/);
  assert.match(String(mmaShapeProblem({ ...t, bs: 8 }, fd)), /block_size 8 a multiple of 16/);
  assert.match(String(mmaShapeProblem(t, { ...fd, ablate: "stage" })), /stage nothing/);
  // Every named shape fits an H200's 48 KB; the default order starts at w8r1k16-fvri.
  for (const [name, shape] of Object.entries(MMA_VARIANTS)) {
    assert.equal(mmaShapeProblem(t, shape, 49152), null, name);
  }
  assert.deepEqual(chooseMmaShape(t, 49152), MMA_SHAPES[0]);
  assert.deepEqual(MMA_SHAPES[0], MMA_VARIANTS["w8r1k16-fvri"]);
  assert.deepEqual(MMA_SHAPES[1], MMA_VARIANTS["w8r1k16-fri"]);
  // A 64-lane subgroup gives a lane 4 columns of a 16-column pass: no 16-byte stores there.
  assert.deepEqual(chooseMmaShape({ ...t, sg: 64 }, 49152), { ...MMA_SHAPES[1] });
});

Deno.test("flash_mma: ATTN_PREFILL_MMA_SHAPE names a shape, or the error names the value", async () => {
  const shape = (v: string | undefined) => withEnv({ ATTN_PREFILL_MMA_SHAPE: v }, envMmaShape);
  assert.equal(await shape(undefined), undefined);
  assert.deepEqual(await shape("w8r1k16-fd"), MMA_VARIANTS["w8r1k16-fd"]);
  await assert.rejects(
    () => shape("w9r9"),
    /ATTN_PREFILL_MMA_SHAPE="w9r9" names no shape; known: w8r1k16/,
  );
  // v0.7's single-buffered: removed.
  await assert.rejects(
    () => shape("w8r1k32-fb"),
    /ATTN_PREFILL_MMA_SHAPE="w8r1k32-fb" names no shape/,
  );
  await assert.rejects(
    () => shape("w8r1k16-fu"),
    /"w8r1k16-fu" is a bench-only shape \(per-subgroup rescale/,
  );
});

Deno.test("flash_mma: a named shape a batch cannot take falls back to the default shape", () => {
  const fake = {
    limits: { maxComputeWorkgroupStorageSize: 49152, maxStorageBuffersPerShaderStage: 10 },
  } as unknown as GpuContext;
  const mma = { m: 16, n: 16, k: 16, sg: 32 };
  const batch = (kv_cache_dtype: "auto" | "bfloat16") => {
    const g = generateBatch(base({ kv_cache_dtype }), 1);
    return validHostBatch(
      g.batch,
      HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache),
    );
  };
  const named = MMA_VARIANTS["w8r1k16-fd"];
  const f16 = mmaConstsOf(fake, batch("auto"), mma, undefined, named);
  assert.ok(!(f16 instanceof MmaRefusal) && f16.direct && f16.fast && f16.causal, String(f16));
  const bf16 = mmaConstsOf(fake, batch("bfloat16"), mma, undefined, named);
  assert.ok(!(bf16 instanceof MmaRefusal), String(bf16));
  // the default shape (fast, pipelined: the batch's features compiled in, so causal)
  assert.deepEqual(
    [bf16.nsg, bf16.rm, bf16.bk, bf16.direct, bf16.fast, bf16.pipe, bf16.causal],
    [8, 1, 16, false, true, true, true],
  );
});
