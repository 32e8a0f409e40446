/**
 * WEBGPU_FLASH against CPU_REFERENCE on small fresh-random batches: decode, prefill, mixed,
 * encoder, encoder_only, encoder_decoder, with GQA, soft cap, ALiBi, sinks, sliding window,
 * LSE, every KV-cache dtype and both layouts, a forced multi-chunk cache; the cache after
 * the call must hold the same bytes as the reference's. Skipped without a WebGPU adapter.
 */
import assert from "node:assert/strict";
import { flashConfig, makeWebGpuFlash, WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import {
  FLASH_TILES,
  type FlashTile as FlashTileT,
  flashTileUnfit,
  parseFlashTile,
} from "../../backends/flash_plan.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { isSoftware } from "../../backends/decode_shape.ts";
import { ServiceError } from "../../core/errors.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { type BatchSpec, generateBatch } from "../support/batches.ts";
import { checkBackend, type CheckOptions } from "../support/backend_check.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { freshSeed, GPU, NO_GPU } from "../gpu/helpers.ts";

const ctx = { gpu: GPU };

function check(s: BatchSpec, o: CheckOptions = {}): Promise<void> {
  return checkBackend(WEBGPU_FLASH as AttentionBackend, GPU!, s, o);
}

const base = (o: Partial<BatchSpec>): BatchSpec => ({
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 16,
  head_size: 64,
  num_heads: 4,
  num_kv_heads: 2,
  requests: [{ query_len: 1, seq_len: 20 }],
  return_lse: true,
  ...o,
});

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

// Every prefill tile against the reference on a hostile batch: rows not a multiple of the
// tile's rows, keys not a multiple of its keys, features rotating over the tiles.
const FEATURES: Partial<BatchSpec>[] = [
  { dtype: "float16", sinks: true, sliding_window: 19 },
  { kv_cache_dtype: "fp8_e4m3", k_scale: 0.5, v_scale: 2, alibi: true },
  { dtype: "bfloat16", layout: "HND", logits_soft_cap: 4 },
  {
    attn_type: "encoder",
    alibi: true,
    sliding_window: 11,
    requests: [{ query_len: 37, seq_len: 37 }, { query_len: 1, seq_len: 1 }, {
      query_len: 12,
      seq_len: 12,
    }],
  },
  { kv_cache_dtype: "bfloat16", causal: false, sinks: true },
  { dtype: "float16", kv_cache_dtype: "fp8_e5m2", logits_soft_cap: 7, alibi: true },
];
// Every tile in the adapter's default form (loops on software adapters, unrolled on GPUs), and
// the other form of the GPU default and the lavapipe default, all at head size 64 (Dawn on
// lavapipe compiles an unrolled head-128 variant for minutes).
const SOFT = GPU ? isSoftware(GPU) : true;
const TILES: FlashTileT[] = [
  ...FLASH_TILES.map(([a, b, c, d]): FlashTileT => [a, b, c, d, !SOFT]),
  [8, 8, 4, 4, SOFT],
  [4, 8, 4, 4, SOFT],
];
TILES.forEach((tile, k) => {
  const name = `${tile.slice(0, 4).join("x")}${tile[4] ? "u" : "l"}`;
  Deno.test(`flash tile ${name} vs reference`, { ignore: NO_GPU }, async () => {
    const d = [64, 32].find((x) => !flashTileUnfit(x, tile, GPU!.limits, Infinity));
    assert.ok(d, `tile ${name} fits no head size here`);
    const backend = makeWebGpuFlash({ tile, decode: { ...DEFAULT_DECODE_TUNING } });
    const s = base({
      head_size: d,
      num_heads: 8,
      num_kv_heads: 2,
      requests: [{ query_len: 37, seq_len: 53 }, { query_len: 1, seq_len: 9 }, {
        query_len: 12,
        seq_len: 12,
        pad: 1,
      }],
      ...FEATURES[k % FEATURES.length],
    });
    const g = generateBatch(s, 1);
    const c = g.cache_spec
      ? await backend.importCache(g.cache_spec, g.key_cache, g.value_cache, ctx)
      : null;
    const plan = await backend.plan(validHostBatch(g.batch, c), ctx);
    assert.ok(
      plan.kernels.some((x) =>
        x.includes(`rm=${tile[2]},rn=${tile[3]},tx=${tile[0]},ty=${tile[1]},unroll=${tile[4]}`)
      ),
      plan.kernels.join(", "),
    );
    backend.disposePlan?.(plan);
    c?.destroy();
    await checkBackend(backend as AttentionBackend, GPU!, s);
  });
});

Deno.test("flash: tiles parse, fit and are chosen by the device's limits", () => {
  assert.deepEqual(parseFlashTile("8x4x4x2"), [8, 4, 4, 2]);
  assert.deepEqual(parseFlashTile("8x4x4x2l"), [8, 4, 4, 2, false]);
  assert.throws(() => parseFlashTile("8x8x4"), /TXxTYxRMxRN/);
  assert.throws(() => parseFlashTile("3x8x4x4"), /TX must be/);
  const l48 = { maxComputeWorkgroupStorageSize: 49152, maxComputeInvocationsPerWorkgroup: 256 };
  const l32 = { ...l48, maxComputeWorkgroupStorageSize: 32768 };
  assert.equal(flashConfig(128, l48, parseFlashTile("8x8x4x4l"))?.unroll, false);
  assert.equal(flashConfig(128, l48, null, true)?.unroll, true);
  assert.equal(flashConfig(128, l48, null, false)?.unroll, false);
  assert.deepEqual(flashConfig(128, l48)?.rows, 32);
  assert.equal(flashConfig(128, l48)?.bk, 32);
  assert.equal(flashConfig(128, l32)?.tx, 4, "4x8x4x4 where 8x8x4x4 does not fit");
  assert.match(flashTileUnfit(128, [8, 8, 4, 4], l32) ?? "", /39424 B of workgroup memory/);
  assert.match(flashTileUnfit(80, [8, 8, 4, 4], l48) ?? "", /TX 8 does not divide/);
  assert.equal(flashConfig(128, l32, [8, 4, 4, 4])?.wg, 32, "an explicit tile that fits wins");
  assert.equal(flashConfig(128, l32, [8, 8, 4, 4])?.tx, 4, "one that does not falls back");
  for (const d of [32, 64, 80, 96, 112, 128, 160, 192, 256]) {
    assert.ok(flashConfig(d, { maxComputeWorkgroupStorageSize: 16384 }), `hd ${d} on 16 KiB`);
  }
});

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
    const c = await WEBGPU_FLASH.importCache(g.cache_spec!, g.key_cache, g.value_cache, ctx);
    const plan = await WEBGPU_FLASH.plan(validHostBatch(g.batch, c), ctx);
    assert.equal(plan.info.decode_rows, 2, "two decode rows");
    assert.ok(plan.info.prefill_tiles > 0, "prefill tiles for the rest");
    assert.ok(plan.kernels.some((k) => k.startsWith("decode_split(")), plan.kernels.join(", "));
    assert.ok(plan.kernels.some((k) => k.startsWith("flash(")), plan.kernels.join(", "));
    WEBGPU_FLASH.disposePlan?.(plan);
    c.destroy();
    await check(s, { minItems: 2 });
  },
);

Deno.test("flash: concurrent calls in flight", { ignore: NO_GPU }, async () => {
  await Promise.all(
    [0, 1, 2].map((i) => check(base({ requests: [{ query_len: 1 + i, seq_len: 10 + 7 * i }] }))),
  );
});
