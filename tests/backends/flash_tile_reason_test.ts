/**
 * A named prefill tile (`ATTN_FLASH_TILE`, WEBGPU_FLASH's `tile` option) that does not fit the
 * batch's head size is replaced by the automatic tile; the config says so (`replaced`) and a
 * warning line does, but the plan's paths did not: `X-Attention-Path-Reasons` gave only why the
 * rows are not on the tensor core. Now each part on the portable `tiles` kernel has the
 * replacement appended to its reason, in the library plan's paths and over HTTP; parts on other
 * kernels (the split-KV kernels) are unchanged. Skipped without a WebGPU adapter.
 */
import assert from "node:assert/strict";
import { type FlashPlan, makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import type { FlashTile } from "../../backends/flash_plan.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { GpuKvCache } from "../../gpu/kv_cache.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { MANAGER } from "../support/gpu.ts";
import { rand, startServer } from "../server/helpers.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

const GPU_TEST = { ignore: NO_GPU, sanitizeResources: false, sanitizeOps: false };

/** TX 32 divides no row of head size 64 (16 vec4 columns) or 32 (8), on any device. */
const UNFIT: FlashTile = [32, 4, 1, 1];

/** WEBGPU_FLASH on the portable kernel with `tile` (prefill rows on the tiles unless `split`). */
const flash = (tile: FlashTile | null, split = false) =>
  makeWebGpuFlash({
    tile,
    decode: { ...DEFAULT_DECODE_TUNING },
    mma: false,
    prefill_split: split,
  });

/** The paths of `b`'s plan for a fresh batch of `spec` (the plan disposed, nothing run). */
async function pathsOf(b: AttentionBackend<FlashPlan>, spec: BatchSpec) {
  const g = generateBatch(spec, 1);
  const cache = await GpuKvCache.fromBytes(GPU!, g.cache_spec!, g.key_cache, g.value_cache);
  const lines: string[] = [];
  const was = console.error;
  console.error = (...a: unknown[]) => lines.push(a.map(String).join(" "));
  try {
    const plan = await b.plan(validHostBatch(g.batch, cache), { gpu: GPU });
    b.disposePlan?.(plan);
    return plan.paths;
  } finally {
    console.error = was;
    cache.destroy();
  }
}

const MIXED = [{ query_len: 1, seq_len: 30 }, { query_len: 9, seq_len: 30 }];
const OFF = "tensor-core kernel disabled (option mma: false)";
const REPLACED = (d: number, cols: number) =>
  new RegExp(
    `^flash tile 32x4x1x1 \\(ATTN_FLASH_TILE\\) does not fit head size ${d} on this device ` +
      `\\(TX 32 does not divide the ${cols} vec4 columns of head size ${d}\\): tile ` +
      `\\d+x\\d+x\\d+x\\d+[ul]? runs instead$`,
  );

Deno.test(
  "flash tile reason: prefill rows on the tiles say the tile was replaced",
  GPU_TEST,
  async () => {
    const p = await pathsOf(flash(UNFIT), smallSpec({ head_size: 64, requests: MIXED }));
    assert.equal(p.header, "decode=split_kv, prefill=tiles");
    assert.deepEqual(p.parts[0], { part: "decode", path: "split_kv" });
    const why = p.parts[1].reason ?? "";
    assert.ok(why.startsWith(`${OFF}; `), why);
    assert.match(why.slice(OFF.length + 2), REPLACED(64, 16));
    assert.equal(p.reasons_header, `prefill="${why}"`);
  },
);

Deno.test(
  "flash tile reason: decode rows on the tiles too (no split kernel)",
  GPU_TEST,
  async () => {
    // Head size 32: the split-KV kernels take none; every row on the tiles.
    const p = await pathsOf(flash(UNFIT), smallSpec({ head_size: 32, requests: MIXED }));
    assert.equal(p.header, "decode=tiles, prefill=tiles");
    const head = "head_size not supported (got 32; supported: 64, 80, 96, 112, 128, 192, 256); ";
    const [d, f] = p.parts.map((x) => x.reason ?? "");
    assert.ok(d.startsWith(head), d);
    assert.match(d.slice(head.length), REPLACED(32, 8));
    assert.match(f.slice(OFF.length + 2), REPLACED(32, 8));
  },
);

Deno.test(
  "flash tile reason: a tile that fits, none named, or no rows on the tiles: unchanged",
  GPU_TEST,
  async () => {
    const spec = smallSpec({ head_size: 64, requests: MIXED });
    for (const b of [flash([4, 4, 1, 1]), flash(null)]) {
      const p = await pathsOf(b, spec);
      assert.deepEqual(p.parts[1], { part: "prefill", path: "tiles", reason: OFF });
    }
    // The prefill rows on the split-KV kernels: the tile runs nothing.
    const split = await pathsOf(flash(UNFIT, true), spec);
    assert.equal(split.header, "decode=split_kv, prefill=split_kv");
    assert.deepEqual(split.parts[1], { part: "prefill", path: "split_kv", reason: OFF });
  },
);

Deno.test(
  "flash tile reason: the answer's X-Attention-Path-Reasons over HTTP",
  GPU_TEST,
  async () => {
    const srv = await startServer({
      backends: [flash(UNFIT) as AttentionBackend],
      device: MANAGER,
      memoryBudgetBytes: 2 ** 26,
    });
    const lines: string[] = [];
    const was = console.error;
    console.error = (...a: unknown[]) => lines.push(a.map(String).join(" "));
    try {
      const [H, HKV, D, BS] = [4, 2, 64, 16];
      const put = await fetch(`${srv.url}/v1/kv-caches/tile-reason`, {
        method: "PUT",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          num_blocks: 4,
          block_size: BS,
          num_kv_heads: HKV,
          head_size: D,
          dtype: "float32",
        }),
      });
      assert.equal(put.status, 201, await put.text());
      // A decode row (request 0, block 0) and a 9-token prefill (request 1, block 1).
      const lens = [1, 9], T = 10;
      const t = (h: number) => ({ dtype: "float32", shape: [T, h, D], data: rand(T * h * D) });
      const res = await fetch(`${srv.url}/v1/attention/forward`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          dtype: "float32",
          kv_cache: "tile-reason",
          layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
          query: t(H),
          key: t(HKV),
          value: t(HKV),
          metadata: {
            query_start_loc: [0, 1, T],
            seq_lens: lens,
            block_table: [[0], [1]],
            slot_mapping: [0, ...Array.from({ length: 9 }, (_, i) => BS + i)],
          },
        }),
      });
      await res.arrayBuffer();
      assert.equal(res.status, 200);
      assert.equal(res.headers.get("x-attention-paths"), "decode=split_kv, prefill=tiles");
      const why = res.headers.get("x-attention-path-reasons") ?? "";
      const m = /^prefill="(.*)"$/.exec(why);
      assert.ok(m, why);
      assert.ok(m[1].startsWith(`${OFF}; `), why);
      assert.match(m[1].slice(OFF.length + 2), REPLACED(64, 16));
    } finally {
      console.error = was;
      await srv.close();
    }
  },
);
