/**
 * WEBGPU_DECODE against CPU_REFERENCE on fresh-random hostile decode batches (permuted block
 * table, null block, NaN in every slot no request may read, -1 slots): GQA 1/4/8, every head
 * size it declares (64/80/96/112/128/192/256), block sizes 16/32/64, a 4500-token context split many
 * ways, every KV-cache
 * dtype, both layouts, sinks, sliding window, soft cap, ALiBi, LSE, cross-attention decode,
 * a multi-chunk cache, the subgroup-free fallback and the GPU kernel shape (several key
 * groups merged in workgroup memory). The cache after the call must hold the reference's
 * bytes. Prefill and mixed batches run too (each query token a decode row). Core WGSL only:
 * the numeric tests run on any adapter (lavapipe, llvmpipe through GL, real GPUs); on GL the
 * GPU-sized kernel shapes are skipped (see the GL guard below).
 */
import assert from "node:assert/strict";
import { deviceReasons, validateConfiguration } from "../../backends/capabilities.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { BackendRegistry, selectorConfigDefaults } from "../../backends/registry.ts";
import {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
  makeWebGpuDecode,
  WEBGPU_DECODE,
} from "../../backends/webgpu_decode.ts";
import { ServiceError } from "../../core/errors.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { AttentionBackend, GpuContext, KvCache } from "../../core/types.ts";
import { toFloat32 } from "../../core/data.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { checkBackend, type CheckOptions, tolerance } from "../support/backend_check.ts";
import { assertClose } from "../support/compare.ts";
import { freshSeed, GPU, NO_GPU } from "../gpu/helpers.ts";
import { withEnv } from "../support/env.ts";

const SKIP = NO_GPU;
const ctx = { gpu: GPU };

interface Opts extends CheckOptions {
  tuning?: Partial<DecodeTuning>;
}

function check(s: BatchSpec, o: Opts = {}): Promise<void> {
  const backend = o.tuning
    ? makeWebGpuDecode({ ...DEFAULT_DECODE_TUNING, ...o.tuning })
    : WEBGPU_DECODE;
  return checkBackend(backend as AttentionBackend, GPU!, s, o);
}

const base = (o: Partial<BatchSpec>): BatchSpec =>
  smallSpec({
    dtype: "float32",
    num_heads: 8,
    requests: [
      { query_len: 1, seq_len: 37 },
      { query_len: 1, seq_len: 130, pad: 1 },
      { query_len: 0, seq_len: 9 },
      { query_len: 1, seq_len: 1 },
    ],
    ...o,
  });
const GPU_SHAPE = { workgroup_size: 128, keys_per_iter: 4, kv_heads_per_group: 1 };
const MANY = { target_workgroups: 4096, wave_workgroups: 528, min_split_keys: 16 };

const CASES: [string, BatchSpec, Opts?][] = [
  ["f32 GQA4 hd64 NHD bs16", base({})],
  [
    "f16 MHA (GQA1) hd128 HND bs32",
    base({
      dtype: "float16",
      head_size: 128,
      num_heads: 4,
      num_kv_heads: 4,
      layout: "HND",
      block_size: 32,
    }),
  ],
  [
    "bf16 GQA8 hd256 bs64 sinks",
    base({
      dtype: "bfloat16",
      head_size: 256,
      num_heads: 8,
      num_kv_heads: 1,
      block_size: 64,
      sinks: true,
    }),
  ],
  [
    "f16 cache fp8_e4m3 k/v scales window",
    base({
      dtype: "float16",
      kv_cache_dtype: "fp8_e4m3",
      k_scale: 0.5,
      v_scale: 2,
      sliding_window: 50,
    }),
  ],
  [
    "f32 cache fp8_e5m2 HND soft cap ALiBi",
    base({ kv_cache_dtype: "fp8_e5m2", layout: "HND", logits_soft_cap: 8, alibi: true, q_std: 3 }),
  ],
  [
    "bf16 data, f16 cache, everything",
    base({
      dtype: "bfloat16",
      kv_cache_dtype: "float16",
      sinks: true,
      sliding_window: 40,
      logits_soft_cap: 5,
      alibi: true,
    }),
  ],
  [
    "f32 cache bf16 hd128 no lse",
    base({ kv_cache_dtype: "bfloat16", head_size: 128, return_lse: false }),
  ],
  [
    "long context 4500 split many ways",
    base({
      dtype: "float16",
      head_size: 128,
      num_heads: 8,
      num_kv_heads: 2,
      requests: [{ query_len: 1, seq_len: 4500, pad: 1 }, { query_len: 1, seq_len: 700 }],
    }),
    { tuning: MANY, minItems: 60 },
  ],
  [
    "GPU shape (key groups merged), GQA8 hd128",
    base({
      dtype: "float16",
      head_size: 128,
      num_heads: 16,
      num_kv_heads: 2,
      requests: [{ query_len: 1, seq_len: 1000 }, { query_len: 1, seq_len: 3 }],
    }),
    { tuning: { ...GPU_SHAPE, ...MANY }, minItems: 4 },
  ],
  [
    "GPU shape fp8_e4m3 HND sinks window",
    base({ kv_cache_dtype: "fp8_e4m3", layout: "HND", sinks: true, sliding_window: 70 }),
    { tuning: GPU_SHAPE },
  ],
  ["no subgroups (workgroup-memory sums), late V loads", base({ dtype: "float16", sinks: true }), {
    tuning: { subgroups: false, early_values: false },
  }],
  [
    "H200 lane layout (16 lanes/row) via workgroup-memory sums, hd128 f16",
    base({ dtype: "float16", head_size: 128, num_heads: 16, num_kv_heads: 4, sinks: true }),
    { tuning: { ...GPU_SHAPE, subgroups: false, fallback_lanes: 32, ...MANY } },
  ],
  [
    "H200 lane layout (32 lanes/row, 2 columns each), hd256 f32",
    base({ head_size: 256, alibi: true }),
    { tuning: { ...GPU_SHAPE, subgroups: false, fallback_lanes: 32 } },
  ],
  [
    "no subgroups, GPU shape, hd256",
    base({ head_size: 256, num_heads: 4, num_kv_heads: 2, logits_soft_cap: 10 }),
    { tuning: { ...GPU_SHAPE, subgroups: false, ...MANY } },
  ],
  [
    "GQA tiled (group 16 > 8 heads)",
    base({ dtype: "float16", num_heads: 16, num_kv_heads: 1, alibi: true }),
    { tuning: MANY },
  ],
  ["multi-chunk cache", base({ dtype: "float16", head_size: 128 }), { maxBlocksPerChunk: 3 }],
  [
    "head size 80 fp8_e5m2",
    base({ head_size: 80, kv_cache_dtype: "fp8_e5m2", num_heads: 4, num_kv_heads: 2 }),
  ],
  ["head size 96 f16 GPU shape", base({ dtype: "float16", head_size: 96 }), { tuning: GPU_SHAPE }],
  [
    "head size 112 bf16",
    base({ dtype: "bfloat16", head_size: 112, requests: [{ query_len: 1, seq_len: 40 }] }),
  ],
  [
    "head size 192 fp8_e4m3 HND",
    base({ head_size: 192, kv_cache_dtype: "fp8_e4m3", layout: "HND", sinks: true }),
  ],
  [
    "cross-attention decode (encoder_decoder)",
    base({
      attn_type: "encoder_decoder",
      requests: [{ query_len: 1, seq_len: 45 }, { query_len: 1, seq_len: 12 }],
    }),
  ],
  [
    "prefetch (double-buffered loads), GPU shape, window: unaligned slice starts, fp8_e4m3",
    base({
      dtype: "float16",
      kv_cache_dtype: "fp8_e4m3",
      head_size: 128,
      sliding_window: 301,
      sinks: true,
      requests: [{ query_len: 1, seq_len: 700 }, { query_len: 1, seq_len: 90, pad: 1 }],
    }),
    { tuning: { ...GPU_SHAPE, ...MANY, prefetch: true }, minItems: 4 },
  ],
  [
    "prefetch, software shape, 2 keys a step, bf16 ALiBi soft cap",
    base({ kv_cache_dtype: "bfloat16", alibi: true, logits_soft_cap: 6 }),
    { tuning: { prefetch: true, keys_per_iter: 2, ...MANY } },
  ],
  [
    "ALiBi with a non-causal window (cross-attention rows see keys after their position)",
    base({
      attn_type: "encoder_decoder",
      alibi: true,
      sliding_window: 4,
      requests: [{ query_len: 6, seq_len: 40 }, { query_len: 1, seq_len: 25 }],
    }),
  ],
  [
    "cross-attention decode, no new K/V",
    base({
      attn_type: "encoder_decoder",
      cross_write: false,
      requests: [{ query_len: 1, seq_len: 33 }],
    }),
  ],
];

// llvmpipe through GL compiles kernels with large workgroup arrays in minutes (naga's one-array
// zero initialisation; wgsl/README.md): the GPU-sized shapes run on Vulkan adapters only.
const GL = Deno.env.get("DENO_WEBGPU_BACKEND") === "gl";
const gpuSized = (o?: Opts) => (o?.tuning?.workgroup_size ?? 0) >= 64;
if (GL) console.warn("decode: GPU-sized kernel shapes skipped on GL (minutes to compile there)");

for (const [name, spec, opts] of CASES) {
  Deno.test(
    `decode vs reference: ${name}`,
    { ignore: SKIP || (GL && gpuSized(opts)) },
    () => check(spec, opts),
  );
}

const fakeGpu = (features: string[]): GpuContext => ({
  device: {} as GPUDevice,
  adapter_info: { vendor: "", architecture: "", device: "", description: "fake" },
  features: new Set(features),
  limits: {},
  generation: 1,
  lost: false,
});

Deno.test("decode: descriptor and selector", () => {
  const b = WEBGPU_DECODE;
  assert.equal(b.name, "WEBGPU_DECODE");
  assert.equal(b.priority, 20);
  assert.equal(b.cache_storage, "webgpu");
  assert.deepEqual(b.requires.features, [], "core WGSL only: runs on GL as well");
  assert.deepEqual(b.capabilities.head_sizes, [64, 80, 96, 112, 128, 192, 256]);
  assert.deepEqual(b.capabilities.block_sizes, [16, 32, 64]);
  const cfg = selectorConfigDefaults({ head_size: 128, dtype: "float16", block_size: 16 });
  // Any query length: a longer query is several decode rows.
  assert.equal(b.supportsCombination, undefined);
  assert.deepEqual(deviceReasons(b.requires, fakeGpu([])), []);
  const reg = new BackendRegistry(
    [CPU_REFERENCE as AttentionBackend, b as AttentionBackend],
    () => fakeGpu([]),
  );
  for (const q of [1, 7]) {
    assert.equal(reg.select({ ...cfg, max_query_len: q }).backend.name, "WEBGPU_DECODE");
  }
  assert.deepEqual(
    validateConfiguration(b, { ...cfg, attn_type: "encoder" }, { gpu: fakeGpu([]) }),
    ["attention type encoder not supported (supported: decoder, encoder_decoder)"],
  );
});

Deno.test("decode: runs prefill and mixed batches as decode rows", { ignore: SKIP }, async () => {
  await check(
    base({
      dtype: "float16",
      head_size: 128,
      requests: [
        { query_len: 1, seq_len: 40 },
        { query_len: 9, seq_len: 9 },
        { query_len: 5, seq_len: 70, pad: 2 },
      ],
      sliding_window: 6,
      alibi: true,
    }),
    { minItems: 15 },
  );
});

Deno.test(
  "decode: a host cache is refused with 422 cache_storage_mismatch",
  { ignore: SKIP },
  async () => {
    const g = generateBatch(base({}), freshSeed());
    const host = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
    const batch = validHostBatch(g.batch, host);
    const plan = await WEBGPU_DECODE.plan(batch, ctx);
    await assert.rejects(
      () => WEBGPU_DECODE.run(plan, batch, ctx),
      (e) => e instanceof ServiceError && e.status === 422 && e.code === "cache_storage_mismatch",
    );
    WEBGPU_DECODE.disposePlan?.(plan);
  },
);

Deno.test("decode: concurrent calls in flight", { ignore: SKIP }, async () => {
  const specs = [
    base({ dtype: "float16" }),
    base({ head_size: 128, sinks: true }),
    base({ kv_cache_dtype: "fp8_e5m2" }),
  ];
  const gens = specs.map((s) => generateBatch(s, freshSeed()));
  const caches: KvCache[] = await Promise.all(
    gens.map((g) => WEBGPU_DECODE.importCache(g.cache_spec!, g.key_cache, g.value_cache, ctx)),
  );
  try {
    const got = await Promise.all(gens.map(async (g, i) => {
      const batch = validHostBatch(g.batch, caches[i]);
      return WEBGPU_DECODE.run(await WEBGPU_DECODE.plan(batch, ctx), batch, ctx);
    }));
    for (const [i, g] of gens.entries()) {
      const host = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
      const want = await CPU_REFERENCE.run({}, validHostBatch(g.batch, host), { gpu: null });
      assertClose(toFloat32(got[i].output), toFloat32(want.output), {
        ...tolerance(specs[i]),
        label: `call ${i} (seed ${g.seed})`,
      });
    }
  } finally {
    for (const c of caches) c.destroy();
  }
});

Deno.test("decode: ATTN_DECODE_TUNING overrides the tuning and rejects unknown fields", async () => {
  await withEnv({ ATTN_DECODE_TUNING: '{"workgroup_size":256,"subgroups":false}' }, () => {
    const t = envDecodeTuning();
    assert.equal(t.workgroup_size, 256);
    assert.equal(t.subgroups, false);
    assert.equal(t.keys_per_iter, DEFAULT_DECODE_TUNING.keys_per_iter);
  });
  await withEnv({ ATTN_DECODE_TUNING: '{"warp_size":32}' }, () => {
    assert.throws(
      () => envDecodeTuning(),
      /ATTN_DECODE_TUNING must be a JSON object of .*: unknown field or wrong type: warp_size/,
    );
  });
});
