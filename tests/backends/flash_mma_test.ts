/**
 * The subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl through gpu/flash_mma_launch.ts)
 * against CPU_REFERENCE on fresh random hostile batches: causal prefill, mixed prefill +
 * decode rows, GQA groups 1/4/8, head sizes 64/128/256, soft cap, ALiBi, sinks, sliding
 * windows, LSE, f16/bf16 data, f16/bf16/fp8 caches (finite bf16 values beyond f16's
 * range clamp to +-65504; NaN and infinities: nan_read_slot_test.ts), NHD and HND, padding slots, a multi-chunk cache, encoder,
 * encoder_only and encoder_decoder, several kernel shapes and the exact-FA2 rescale
 * (tau 0). Needs a Dawn device with `chromium-experimental-subgroup-matrix`
 * (gpu/flash_mma_device.ts); skipped with the stated reason anywhere else (CI, Deno's own
 * WebGPU). Run with --allow-all (Dawn is a Node-API addon: --allow-ffi).
 */
import assert from "node:assert/strict";
import { mmaConstsOf, mmaTargetOf } from "../../backends/flash_mma_plan.ts";
import { chooseMmaShape, type MmaShape } from "../../gpu/flash_mma_shape.ts";
import { MMA_FEATURE, mmaSupportOf } from "../../gpu/flash_mma_kernel.ts";
import type { GpuContext } from "../../core/types.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch } from "../support/batches.ts";
import {
  base,
  checkMma,
  freshSeed,
  type MmaCaseOptions,
  mmaTestDevice,
} from "../support/mma_case.ts";

const ctx = await mmaTestDevice("flash_mma tests");
const SKIP = ctx === null;

/** Kernel shapes by name (bk 0: the default shape's); `default` is the first that fits. */
type ShapeName = "default" | "wide" | "rm2" | "fa2" | "bk32";
const SHAPES: Record<Exclude<ShapeName, "default">, MmaShape> = {
  wide: { nsg: 4, rm: 1, bk: 0, tau: 8 },
  rm2: { nsg: 2, rm: 2, bk: 0, tau: 8 },
  fa2: { nsg: 2, rm: 1, bk: 0, tau: 0 },
  bk32: { nsg: 2, rm: 1, bk: 32, tau: 8 },
};

const CASES: [string, BatchSpec, ShapeName, Partial<MmaCaseOptions>?][] = [
  [
    "causal prefill f16 GQA4 hd128",
    base({
      head_size: 128,
      requests: [{ query_len: 37, seq_len: 37 }, { query_len: 20, seq_len: 45 }],
    }),
    "default",
  ],
  [
    "mixed prefill+decode bf16 HND bs32 GQA8 pad",
    base({
      dtype: "bfloat16",
      layout: "HND",
      block_size: 32,
      num_kv_heads: 1,
      requests: [
        { query_len: 1, seq_len: 50 },
        { query_len: 19, seq_len: 40, pad: 2 },
        {
          query_len: 0,
          seq_len: 9,
        },
        { query_len: 5, seq_len: 5 },
        { query_len: 1, seq_len: 3 },
      ],
    }),
    "wide",
  ],
  [
    "softcap alibi window sinks MHA, exact FA2 rescale",
    base({
      num_heads: 4,
      num_kv_heads: 4,
      logits_soft_cap: 5,
      alibi: true,
      sliding_window: 7,
      sinks: true,
      requests: [{ query_len: 12, seq_len: 33 }, { query_len: 1, seq_len: 20 }],
    }),
    "fa2",
  ],
  [
    "alibi long prefill: lazy rescales",
    base({
      alibi: true,
      q_std: 3,
      requests: [{ query_len: 70, seq_len: 90 }],
    }),
    "rm2",
  ],
  [
    "fp8_e4m3 scaled GQA4 hd128",
    base({
      kv_cache_dtype: "fp8_e4m3",
      head_size: 128,
      k_scale: 0.5,
      v_scale: 2,
      requests: [{ query_len: 9, seq_len: 29 }, { query_len: 1, seq_len: 17 }],
    }),
    "default",
  ],
  [
    "fp8_e5m2 HND bf16",
    base({
      dtype: "bfloat16",
      kv_cache_dtype: "fp8_e5m2",
      layout: "HND",
      requests: [{ query_len: 14, seq_len: 18 }],
    }),
    "bk32",
  ],
  [
    "bf16 cache, f16 data, hd256 MQA sinks",
    base({
      kv_cache_dtype: "bfloat16",
      head_size: 256,
      num_heads: 4,
      num_kv_heads: 1,
      sinks: true,
      requests: [{ query_len: 11, seq_len: 30 }, { query_len: 2, seq_len: 2 }],
    }),
    "default",
  ],
  [
    "non-causal decoder window sinks HND",
    base({
      causal: false,
      sliding_window: 5,
      sinks: true,
      layout: "HND",
      requests: [{ query_len: 9, seq_len: 21 }],
    }),
    "default",
  ],
  [
    "multi-chunk f16 cache",
    base({
      requests: [{ query_len: 16, seq_len: 60 }, { query_len: 1, seq_len: 33 }],
    }),
    "wide",
    { maxBlocksPerChunk: 2 },
  ],
  [
    "bf16 cache beyond f16 range: clamped",
    base({
      kv_cache_dtype: "bfloat16",
      requests: [{ query_len: 6, seq_len: 26 }],
    }),
    "default",
    { plant: 1e5 },
  ],
  [
    "encoder GQA4 alibi",
    base({
      attn_type: "encoder",
      alibi: true,
      requests: [{ query_len: 7, seq_len: 7 }, { query_len: 20, seq_len: 20 }],
    }),
    "default",
  ],
  [
    "encoder_only bf16 window",
    base({
      attn_type: "encoder_only",
      dtype: "bfloat16",
      sliding_window: 4,
      num_kv_heads: 8,
      requests: [{ query_len: 13, seq_len: 13 }],
    }),
    "wide",
  ],
  [
    "encoder_decoder sinks",
    base({
      attn_type: "encoder_decoder",
      sinks: true,
      requests: [{ query_len: 3, seq_len: 11 }, { query_len: 1, seq_len: 25 }],
    }),
    "default",
  ],
];

/** The shape `name` for a batch of `s` (bk 0 takes the default shape's). */
function shapeFor(s: BatchSpec, name: ShapeName): MmaShape | undefined {
  if (name === "default") return undefined;
  const shape = { ...SHAPES[name] };
  if (shape.bk === 0) {
    const t = { kv: "float16" as const, dtype: "float16" as const, enc: false, d: s.head_size };
    const off = { causal: false, window: false, softcap: false, alibi: false, sinks: false };
    const target = { ...t, ...off, bs: s.block_size, nhd: true, nchunk: 1, ...ctx!.mma };
    shape.bk = chooseMmaShape(target, ctx!.limits.maxComputeWorkgroupStorageSize)?.bk ?? 16;
  }
  return shape;
}

for (const [name, spec, shapeName, opts] of CASES) {
  Deno.test({
    name: `flash_mma vs reference: ${name}`,
    ignore: SKIP,
    sanitizeOps: false,
    sanitizeResources: false,
    fn: () => checkMma(ctx!, spec, freshSeed(), { shape: shapeFor(spec, shapeName), ...opts }),
  });
}

Deno.test({
  name: "flash_mma: f32 data, a device without subgroup matrices, too big a shape: reasons",
  ignore: SKIP,
  fn: () => {
    const enc = (o: Partial<BatchSpec>) =>
      validHostBatch(generateBatch(base({ attn_type: "encoder_only", ...o }), 1).batch, null);
    const f32 = enc({ dtype: "float32" });
    assert.match(String(mmaTargetOf(ctx!, f32, ctx!.mma)), /float32 data keeps the exact f32 path/);
    assert.match(String(mmaTargetOf(ctx!, enc({}), null)), /no f16 -> f32 subgroup matrices/);
    const big = { nsg: 64, rm: 4, bk: 256, tau: 8 };
    assert.match(String(mmaConstsOf(ctx!, enc({}), ctx!.mma, big)), /B of workgroup memory/);
  },
});

Deno.test("flash_mma: mmaSupportOf reads what the device layer reports", () => {
  const info = {
    vendor: "nvidia",
    architecture: "",
    device: "",
    description: "",
    subgroup_min_size: 32,
    subgroup_max_size: 32,
    subgroup_matrix_configs: [
      { component_type: "f16", result_component_type: "f16", m: 8, n: 8, k: 8 },
      { component_type: "f16", result_component_type: "f32", m: 16, n: 16, k: 16 },
    ],
  };
  const ctx = (features: string[], more = {}) =>
    ({ features: new Set(features), adapter_info: { ...info, ...more } }) as unknown as GpuContext;
  assert.deepEqual(mmaSupportOf(ctx([MMA_FEATURE])), { m: 16, n: 16, k: 16, sg: 32 });
  assert.equal(mmaSupportOf(ctx([])), null);
  assert.equal(mmaSupportOf(ctx([MMA_FEATURE], { subgroup_min_size: 8 })), null);
  assert.equal(mmaSupportOf(ctx([MMA_FEATURE], { subgroup_matrix_configs: [] })), null);
});
