/**
 * WEBGPU_FLASH's prefill register tiles: every tile of FLASH_TILES (and both loop forms of the
 * GPU and lavapipe defaults) against CPU_REFERENCE on a fresh hostile batch (rows not a multiple
 * of the tile's rows, keys not a multiple of its keys, a decode row, padding, features rotating:
 * window, sinks, fp8 / bf16 caches, HND, soft cap, ALiBi, encoder, non-causal), and how tiles are
 * parsed, fitted to the device's limits and chosen. Skipped without a WebGPU adapter.
 */
import assert from "node:assert/strict";
import { flashConfig, makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import {
  FLASH_TILES,
  type FlashTile as FlashTileT,
  flashTileUnfit,
  parseFlashTile,
} from "../../backends/flash_plan.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { isSoftware } from "../../backends/decode_shape.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

const ctx = { gpu: GPU };

const base = (o: Partial<BatchSpec>): BatchSpec =>
  smallSpec({ dtype: "float32", requests: [{ query_len: 1, seq_len: 20 }], ...o });

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
    // The portable kernel, also on devices where the tensor-core one would take f16 prefills.
    const backend = makeWebGpuFlash({
      tile,
      decode: { ...DEFAULT_DECODE_TUNING },
      mma: false,
      prefill_split: false,
    });
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

// prefill_split: every row of a mixed batch on the split-KV kernels (no prefill tiles), still
// equal to the reference; encoder layers keep the tiles (no paged cache to split over).
for (const f of [{ dtype: "float16" as const, sliding_window: 23, sinks: true }, { alibi: true }]) {
  Deno.test(`flash prefill_split: prefill rows as decode rows vs reference`, {
    ignore: NO_GPU,
  }, async () => {
    const backend = makeWebGpuFlash({
      tile: null,
      decode: { ...DEFAULT_DECODE_TUNING },
      mma: false,
      prefill_split: true,
    });
    const s = base({
      num_heads: 8,
      num_kv_heads: 2,
      requests: [{ query_len: 29, seq_len: 61 }, { query_len: 1, seq_len: 9 }, {
        query_len: 7,
        seq_len: 7,
        pad: 1,
      }],
      ...f,
    });
    const g = generateBatch(s, (Math.random() * 2 ** 31) | 0);
    const c = await backend.importCache(g.cache_spec!, g.key_cache, g.value_cache, ctx);
    const plan = await backend.plan(validHostBatch(g.batch, c), ctx);
    assert.equal(plan.info.prefill_tiles, 0, JSON.stringify(plan.info));
    assert.equal(plan.info.decode_rows, 29 + 1 + 7, JSON.stringify(plan.info));
    backend.disposePlan?.(plan);
    c.destroy();
    await checkBackend(backend as AttentionBackend, GPU!, s);
  });
}

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
