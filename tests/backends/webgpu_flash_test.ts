/**
 * WEBGPU_FLASH against CPU_REFERENCE on small fresh-random batches: decode, prefill, mixed,
 * encoder, encoder_only, encoder_decoder, with GQA, soft cap, ALiBi, sinks, sliding window,
 * LSE, every KV-cache dtype and both layouts, a forced multi-chunk cache; the cache after
 * the call must hold the same bytes as the reference's. Skipped without a WebGPU adapter.
 */
import assert from "node:assert/strict";
import { flashConfig, makeWebGpuFlash, WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { ServiceError } from "../../core/errors.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { checkBackend, type CheckOptions } from "../support/backend_check.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { freshSeed, GPU, NO_GPU } from "../gpu/helpers.ts";

const ctx = { gpu: GPU };

function check(s: BatchSpec, o: CheckOptions = {}): Promise<void> {
  return checkBackend(WEBGPU_FLASH as AttentionBackend, GPU!, s, o);
}

const base = (o: Partial<BatchSpec>): BatchSpec =>
  smallSpec({ dtype: "float32", requests: [{ query_len: 1, seq_len: 20 }], ...o });

const CASES: [string, BatchSpec, CheckOptions?][] = [
  [
    "decode f32 GQA",
    base({
      requests: [{ query_len: 1, seq_len: 37 }, { query_len: 1, seq_len: 5 }, {
        query_len: 1,
        seq_len: 16,
      }],
    }),
  ],
  [
    "prefill f16 HND hd128",
    base({
      dtype: "float16",
      layout: "HND",
      head_size: 128,
      requests: [{ query_len: 23, seq_len: 23 }],
    }),
  ],
  [
    "mixed bf16 bs32 pad",
    base({
      dtype: "bfloat16",
      block_size: 32,
      num_heads: 8,
      num_kv_heads: 2,
      requests: [{ query_len: 1, seq_len: 50 }, { query_len: 19, seq_len: 40, pad: 2 }, {
        query_len: 0,
        seq_len: 9,
      }, { query_len: 5, seq_len: 5 }],
    }),
  ],
  [
    "decode hd256 MQA sinks",
    base({
      head_size: 256,
      num_heads: 4,
      num_kv_heads: 1,
      sinks: true,
      requests: [{ query_len: 1, seq_len: 30 }, { query_len: 2, seq_len: 2 }],
    }),
  ],
  [
    "softcap alibi window",
    base({
      logits_soft_cap: 5,
      alibi: true,
      sliding_window: 7,
      requests: [{ query_len: 12, seq_len: 33 }, { query_len: 1, seq_len: 20 }],
    }),
  ],
  [
    "non-causal window sinks HND",
    base({
      causal: false,
      sliding_window: 5,
      sinks: true,
      layout: "HND",
      requests: [{ query_len: 9, seq_len: 21 }],
    }),
  ],
  [
    "fp8_e4m3 scaled",
    base({
      kv_cache_dtype: "fp8_e4m3",
      k_scale: 0.5,
      v_scale: 2,
      requests: [{ query_len: 3, seq_len: 29 }, { query_len: 1, seq_len: 17 }],
    }),
  ],
  [
    "fp8_e5m2 HND f16",
    base({
      dtype: "float16",
      kv_cache_dtype: "fp8_e5m2",
      layout: "HND",
      head_size: 80,
      requests: [{ query_len: 4, seq_len: 18 }],
    }),
  ],
  [
    "f16 cache, f32 data, multi-chunk",
    base({
      kv_cache_dtype: "float16",
      head_size: 96,
      requests: [{ query_len: 6, seq_len: 60 }, { query_len: 1, seq_len: 33 }],
    }),
    { maxBlocksPerChunk: 2 },
  ],
  [
    "encoder GQA alibi",
    base({
      attn_type: "encoder",
      alibi: true,
      requests: [{ query_len: 7, seq_len: 7 }, { query_len: 20, seq_len: 20 }],
    }),
  ],
  [
    "encoder_only f16 window",
    base({
      attn_type: "encoder_only",
      dtype: "float16",
      sliding_window: 4,
      head_size: 32,
      requests: [{ query_len: 13, seq_len: 13 }],
    }),
  ],
  [
    "encoder_decoder writing",
    base({
      attn_type: "encoder_decoder",
      requests: [{ query_len: 3, seq_len: 11 }, { query_len: 1, seq_len: 25 }],
    }),
  ],
  [
    "encoder_decoder no new K/V",
    base({
      attn_type: "encoder_decoder",
      cross_write: false,
      sinks: true,
      requests: [{ query_len: 2, seq_len: 19 }],
    }),
  ],
  [
    "prefill hd160 bf16 window (tile fallback for a head the first tiles do not divide)",
    base({
      dtype: "bfloat16",
      head_size: 160,
      sliding_window: 13,
      requests: [{ query_len: 21, seq_len: 30 }],
    }),
  ],
  [
    "prefill hd192 fp8_e4m3 sinks",
    base({
      kv_cache_dtype: "fp8_e4m3",
      head_size: 192,
      sinks: true,
      requests: [{ query_len: 17, seq_len: 17 }, { query_len: 3, seq_len: 40 }],
    }),
  ],
  [
    "big group (G > rows)",
    base({
      num_heads: 32,
      num_kv_heads: 1,
      head_size: 32,
      requests: [{ query_len: 2, seq_len: 9 }],
    }),
  ],
];

for (const [name, spec, opts] of CASES) {
  Deno.test(`flash vs reference: ${name}`, { ignore: NO_GPU }, () => check(spec, opts));
}

Deno.test("flash: descriptor, config and cache-storage mismatch", { ignore: NO_GPU }, async () => {
  assert.equal(WEBGPU_FLASH.name, "WEBGPU_FLASH");
  assert.equal(WEBGPU_FLASH.cache_storage, "webgpu");
  for (const d of WEBGPU_FLASH.capabilities.head_sizes) {
    assert.ok(flashConfig(d, GPU!.limits), `hd ${d}`);
  }
  assert.equal(flashConfig(24, GPU!.limits), null);
  const g = generateBatch(base({}), 1);
  const host = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
  const batch = validHostBatch(g.batch, host);
  const plan = await WEBGPU_FLASH.plan(batch, ctx);
  await assert.rejects(
    async () => await WEBGPU_FLASH.run(plan, batch, ctx),
    (e: unknown) =>
      e instanceof ServiceError && e.status === 422 && e.code === "cache_storage_mismatch",
  );
  WEBGPU_FLASH.disposePlan?.(plan);
  await assert.rejects(
    async () => await WEBGPU_FLASH.plan(batch, { gpu: null }),
    (e: unknown) => e instanceof ServiceError && e.status === 503,
  );
});

Deno.test(
  "flash: mixed batches split by row (decode rows on the split kernel)",
  { ignore: NO_GPU },
  async () => {
    const s = base({
      dtype: "float16",
      head_size: 128,
      requests: [
        { query_len: 1, seq_len: 300 },
        { query_len: 17, seq_len: 40 },
        { query_len: 1, seq_len: 5, pad: 1 },
        { query_len: 4, seq_len: 4 },
      ],
      sinks: true,
    });
    const g = generateBatch(s, freshSeed());
    // Prefill rows on tiles (prefill_split off), where the split-KV default would take them.
    const flash = makeWebGpuFlash({
      tile: null,
      decode: { ...DEFAULT_DECODE_TUNING },
      prefill_split: false,
    });
    const c = await flash.importCache(g.cache_spec!, g.key_cache, g.value_cache, ctx);
    const plan = await flash.plan(validHostBatch(g.batch, c), ctx);
    assert.equal(plan.info.decode_rows, 2, "two decode rows");
    assert.ok(plan.info.prefill_tiles > 0, "prefill tiles for the rest");
    assert.ok(plan.kernels.some((k) => k.startsWith("decode_split(")), plan.kernels.join(", "));
    // The prefill rows on the portable kernel, or on the tensor-core one where it runs.
    assert.ok(
      plan.kernels.some((k) => k.startsWith("flash(") || k.startsWith("flash_mma(")),
      plan.kernels.join(", "),
    );
    // The plan says so (tests/backends/webgpu_flash_paths_test.ts: every case and reason).
    const onMma = plan.kernels.some((k) => k.startsWith("flash_mma("));
    assert.equal(
      plan.paths.header,
      `decode=split_kv, prefill=${onMma ? "tensor_core" : "tiles"}`,
    );
    assert.equal(plan.paths.reasons_header === "", onMma, plan.paths.reasons_header);
    const r = await flash.run(plan, validHostBatch(g.batch, c), ctx);
    assert.equal(r.paths, plan.paths, "the run hands the plan's paths back");
    r.release?.();
    flash.disposePlan?.(plan);
    c.destroy();
    await check(s, { minItems: 2 });
  },
);

Deno.test("flash: concurrent calls in flight", { ignore: NO_GPU }, async () => {
  await Promise.all(
    [0, 1, 2].map((i) => check(base({ requests: [{ query_len: 1 + i, seq_len: 10 + 7 * i }] }))),
  );
});

Deno.test("flash: decode rows on the split-KV kernels at block sizes 48 and 128", {
  ignore: NO_GPU,
}, async () => {
  // Multiples of the declared 16 / 32 / 64, which the split-KV kernels now take (they went to the
  // portable tiles before); a mixed batch, so the prefill rows run beside them.
  for (const block_size of [48, 128]) {
    const spec = smallSpec({
      block_size,
      requests: [
        { query_len: 1, seq_len: 300 },
        { query_len: 9, seq_len: 60 },
        { query_len: 1, seq_len: 7 },
      ],
      return_lse: true,
    });
    await checkBackend(WEBGPU_FLASH, GPU!, spec);
  }
});
