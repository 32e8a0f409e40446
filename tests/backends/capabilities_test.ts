/**
 * Capability checks: block-size rules (exact and MultipleOf), preferred block size, device
 * reasons, and every reason string of validateConfiguration, on small fake descriptors.
 * @module
 */
import assert from "node:assert/strict";
import {
  deviceReasons,
  preferredBlockSize,
  supportsAttnType,
  supportsBlockSize,
  supportsDType,
  supportsHeadSize,
  supportsKvCacheDType,
  validateConfiguration,
} from "../../backends/capabilities.ts";
import { capabilities } from "../../backends/capabilities_base.ts";
import type {
  AttentionBackend,
  Capabilities,
  GpuContext,
  KernelBlockSize,
  SelectorConfig,
} from "../../core/types.ts";

/** Capabilities that support nothing optional (every flag false). */
function strictCaps(over: Partial<Capabilities> = {}): Capabilities {
  return capabilities({
    dtypes: ["float32"],
    kv_cache_dtypes: ["auto"],
    block_sizes: [16],
    head_sizes: [64, 128],
    kv_cache_layouts: ["NHD"],
    attn_types: ["decoder"],
    ...over,
  });
}

function fake(
  over: Partial<AttentionBackend> = {},
  caps?: Partial<Capabilities>,
): AttentionBackend {
  const fail = () => {
    throw new Error("not used");
  };
  return {
    name: "FAKE",
    priority: 0,
    description: "fake",
    capabilities: strictCaps(caps),
    requires: { needs_device: false, features: [], limits: {} },
    cache_storage: "host",
    createCache: fail,
    importCache: fail,
    plan: fail,
    run: fail,
    ...over,
  };
}

function cfg(over: Partial<SelectorConfig> = {}): SelectorConfig {
  return {
    head_size: 64,
    dtype: "float32",
    kv_cache_dtype: "auto",
    block_size: 16,
    use_mla: false,
    has_sink: false,
    use_sparse: false,
    use_mm_prefix: false,
    attn_type: "decoder",
    has_sliding_window: false,
    use_non_causal: false,
    use_batch_invariant: false,
    use_per_head_quant_scales: false,
    ...over,
  };
}

function gpu(over: Partial<GpuContext> = {}): GpuContext {
  return {
    device: {} as GPUDevice,
    adapter_info: { vendor: "fake", architecture: "", device: "", description: "" },
    features: new Set(["shader-f16"]),
    limits: { maxStorageBufferBindingSize: 134217728, maxComputeWorkgroupSizeX: 256 },
    generation: 1,
    lost: false,
    ...over,
  } as GpuContext;
}

const sizes = (block_sizes: KernelBlockSize[]) => strictCaps({ block_sizes });

Deno.test("supportsBlockSize: vLLM's rule", async (t) => {
  await t.step("MultipleOf(16): 48 valid, 40 invalid", () => {
    const c = sizes([{ multiple_of: 16 }]);
    assert.equal(supportsBlockSize(c, 48), true);
    assert.equal(supportsBlockSize(c, 16), true);
    assert.equal(supportsBlockSize(c, 40), false);
    assert.equal(supportsBlockSize(c, 8), false);
  });
  await t.step("plain [16, 32]: 64 valid (a multiple), 24 invalid", () => {
    const c = sizes([16, 32]);
    assert.equal(supportsBlockSize(c, 64), true);
    assert.equal(supportsBlockSize(c, 32), true);
    assert.equal(supportsBlockSize(c, 24), false);
  });
  await t.step("null and empty list support anything; non-positive never", () => {
    assert.equal(supportsBlockSize(sizes([32]), null), true);
    assert.equal(supportsBlockSize(sizes([]), 7), true);
    assert.equal(supportsBlockSize(sizes([]), 0), false);
    assert.equal(supportsBlockSize(sizes([16]), -16), false);
    assert.equal(supportsBlockSize(sizes([16]), 16.5), false);
  });
});

Deno.test("preferredBlockSize: vLLM's get_preferred_block_size", () => {
  assert.equal(preferredBlockSize(sizes([16, 32])), 16);
  assert.equal(preferredBlockSize(sizes([{ multiple_of: 8 }])), 16);
  assert.equal(preferredBlockSize(sizes([32, 64])), 32);
  assert.equal(preferredBlockSize(sizes([64, 32])), 32);
  assert.equal(preferredBlockSize(sizes([{ multiple_of: 64 }])), 64);
  assert.equal(preferredBlockSize(sizes([])), 16);
  assert.equal(preferredBlockSize(sizes([]), 32), 32);
  assert.equal(preferredBlockSize(sizes([16]), 8), 16);
});

Deno.test("support predicates", () => {
  assert.equal(supportsHeadSize(strictCaps(), 128), true);
  assert.equal(supportsHeadSize(strictCaps(), 72), false);
  assert.equal(supportsHeadSize(strictCaps({ head_sizes: [] }), 72), true);
  assert.equal(supportsDType(strictCaps(), "float32"), true);
  assert.equal(supportsDType(strictCaps(), "float16"), false);
  assert.equal(supportsKvCacheDType(strictCaps(), "auto"), true);
  assert.equal(supportsKvCacheDType(strictCaps(), "fp8_e4m3"), false);
  assert.equal(supportsKvCacheDType(strictCaps({ kv_cache_dtypes: [] }), "fp8_e5m2"), true);
  assert.equal(supportsAttnType(strictCaps(), "decoder"), true);
  assert.equal(supportsAttnType(strictCaps(), "encoder_only"), false);
});

Deno.test("deviceReasons", async (t) => {
  const req = {
    needs_device: true,
    features: ["shader-f16", "subgroups"],
    limits: { maxStorageBufferBindingSize: 268435456, maxComputeWorkgroupSizeX: 256 },
  };
  await t.step("no adapter", () => {
    assert.deepEqual(deviceReasons(req, null), [
      "compute capability not supported: no WebGPU adapter",
    ]);
  });
  await t.step("device lost", () => {
    assert.deepEqual(deviceReasons(req, gpu({ lost: true })), [
      "compute capability not supported: device lost",
    ]);
  });
  await t.step("missing feature and a limit under its minimum", () => {
    assert.deepEqual(deviceReasons(req, gpu()), [
      "compute capability not supported: missing WebGPU feature subgroups",
      "compute capability not supported: limit maxStorageBufferBindingSize is 134217728, needs 268435456",
    ]);
  });
  await t.step("a limit the device does not report", () => {
    const r = deviceReasons({ needs_device: true, features: [], limits: { maxFoo: 1 } }, gpu());
    assert.deepEqual(r, ["compute capability not supported: limit maxFoo is unavailable, needs 1"]);
  });
  await t.step("satisfied device, and host backends need none", () => {
    const ok = gpu({
      features: new Set(["shader-f16", "subgroups"]),
      limits: { maxStorageBufferBindingSize: 268435456, maxComputeWorkgroupSizeX: 1024 },
    });
    assert.deepEqual(deviceReasons(req, ok), []);
    assert.deepEqual(deviceReasons({ ...req, needs_device: false }, null), []);
  });
});

Deno.test("validateConfiguration: each reason alone", async (t) => {
  const ctx = { gpu: null };
  const cases: [string, Partial<SelectorConfig>, Partial<Capabilities>, string][] = [
    ["head", { head_size: 72 }, {}, "head_size not supported (got 72; supported: 64, 128)"],
    ["dtype", { dtype: "float16" }, {}, "dtype not supported (got float16; supported: float32)"],
    [
      "kv dtype",
      { kv_cache_dtype: "fp8_e4m3" },
      {},
      "kv_cache_dtype not supported (got fp8_e4m3; supported: auto)",
    ],
    [
      "block",
      { block_size: 24 },
      { block_sizes: [16, { multiple_of: 32 }] },
      "block_size not supported (got 24; supported: 16, multiple of 32)",
    ],
    [
      "mm prefix",
      { use_mm_prefix: true },
      {},
      "partial multimodal token full attention not supported",
    ],
    ["mla", { use_mla: true }, {}, "MLA not supported"],
    ["non-mla", {}, { is_mla: true }, "non-MLA not supported"],
    ["sinks", { has_sink: true }, {}, "attention sinks not supported"],
    ["sparse", { use_sparse: true }, {}, "sparse not supported"],
    ["non-sparse", {}, { sparse: true }, "non-sparse not supported"],
    [
      "per-head scales",
      { use_per_head_quant_scales: true },
      {},
      "per-head quant scales not supported",
    ],
    [
      "attn type",
      { attn_type: "encoder" },
      {},
      "attention type encoder not supported (supported: decoder)",
    ],
    ["non-causal", { use_non_causal: true }, {}, "non-causal attention not supported"],
    ["batch invariance", { use_batch_invariant: true }, {}, "batch invariance not supported"],
    ["sliding window", { has_sliding_window: true }, {}, "sliding window not supported"],
    ["alibi", { use_alibi: true }, {}, "ALiBi not supported"],
    ["soft cap", { use_logits_soft_cap: true }, {}, "logits soft cap not supported"],
    [
      "layout",
      { kv_cache_layout: "HND" },
      {},
      "kv cache layout HND not supported (supported: NHD)",
    ],
    ["lse", { return_lse: true }, {}, "LSE output not supported"],
    [
      "storage",
      { cache_storage: "webgpu" },
      {},
      "kv cache storage webgpu not supported (backend uses host)",
    ],
  ];
  for (const [name, c, caps, reason] of cases) {
    await t.step(name, () => {
      assert.deepEqual(validateConfiguration(fake({}, caps), cfg(c), ctx), [reason]);
    });
  }
  await t.step("the baseline config is valid, and supported flags add nothing", () => {
    assert.deepEqual(validateConfiguration(fake(), cfg(), ctx), []);
    const all = strictCaps({
      sinks: true,
      sliding_window: true,
      alibi: true,
      logits_soft_cap: true,
      non_causal: true,
      mm_prefix: true,
      per_head_quant_scales: true,
      batch_invariant: true,
      lse: true,
      kv_cache_layouts: ["NHD", "HND"],
    });
    const c = cfg({
      has_sink: true,
      has_sliding_window: true,
      use_alibi: true,
      use_logits_soft_cap: true,
      use_non_causal: true,
      use_mm_prefix: true,
      use_per_head_quant_scales: true,
      use_batch_invariant: true,
      return_lse: true,
      kv_cache_layout: "HND",
      cache_storage: "host",
      block_size: null,
    });
    assert.deepEqual(validateConfiguration(fake({}, all), c, ctx), []);
  });
});

Deno.test("validateConfiguration: vLLM's order, device reasons, supportsCombination last", () => {
  const seen: unknown[] = [];
  const b = fake({
    requires: { needs_device: true, features: ["subgroups"], limits: {} },
    supportsCombination(c, ctx) {
      seen.push(c, ctx);
      return "head_size 64 with sinks needs subgroups";
    },
  });
  const c = cfg({
    head_size: 72,
    dtype: "bfloat16",
    kv_cache_dtype: "fp8_e5m2",
    block_size: 8,
    use_mm_prefix: true,
    use_mla: true,
    has_sink: true,
    use_sparse: true,
    use_per_head_quant_scales: true,
    attn_type: "encoder_decoder",
    use_non_causal: true,
    use_batch_invariant: true,
    has_sliding_window: true,
    use_alibi: true,
    use_logits_soft_cap: true,
    kv_cache_layout: "HND",
    return_lse: true,
    cache_storage: "webgpu",
  });
  const ctx = { gpu: gpu() };
  const prefixes = validateConfiguration(b, c, ctx).map((r) => r.split(" (")[0]);
  assert.deepEqual(prefixes, [
    "head_size not supported",
    "dtype not supported",
    "kv_cache_dtype not supported",
    "block_size not supported",
    "partial multimodal token full attention not supported",
    "MLA not supported",
    "attention sinks not supported",
    "sparse not supported",
    "per-head quant scales not supported",
    "compute capability not supported: missing WebGPU feature subgroups",
    "attention type encoder_decoder not supported",
    "non-causal attention not supported",
    "batch invariance not supported",
    "sliding window not supported",
    "ALiBi not supported",
    "logits soft cap not supported",
    "kv cache layout HND not supported",
    "LSE output not supported",
    "kv cache storage webgpu not supported",
    "head_size 64 with sinks needs subgroups",
  ]);
  assert.equal(seen[0], c);
  assert.equal(seen[1], ctx);
  assert.deepEqual(validateConfiguration(b, cfg(), { gpu: null }), [
    "compute capability not supported: no WebGPU adapter",
    "head_size 64 with sinks needs subgroups",
  ]);
});
