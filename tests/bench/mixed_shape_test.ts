/**
 * bench/shapes.ts's mixed shape (decode rows and prefill chunks in one call): its definition at
 * both sizes, the batch makeBatch builds for it at the --small size (metadata, the service's own
 * validation, a CPU_REFERENCE run), WEBGPU_FLASH's routing of it by row on fake adapters, and
 * bench/measure.ts's split of its device time into parts by pass name. No GPU needed.
 */
import assert from "node:assert/strict";
import {
  benchShapes,
  makeBatch,
  mixedParts,
  shapeName,
  shapeParts,
  work,
} from "../../bench/shapes.ts";
import { partsOf } from "../../bench/measure.ts";
import { cpuReference } from "../../backends/cpu/cpu_reference.ts";
import { CpuWorkerPool } from "../../backends/cpu/pool.ts";
import { flashRouting, resolveFlashOptions } from "../../backends/webgpu_flash.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import { MMA_FEATURE } from "../../gpu/flash_mma_kernel.ts";
import { H200_LIKE } from "../../bench/decode_geometry.ts";
import { toFloat32 } from "../../core/data.ts";
import type { GpuContext } from "../../core/types.ts";
import { validHostBatch } from "../../service/host_input.ts";

const mixedOf = (small: boolean) => {
  const m = benchShapes(small).filter((s) => s.kind === "mixed");
  assert.equal(m.length, 1, "one mixed shape");
  return m[0];
};

Deno.test("mixed shape: 32 decodes at 2048 + 2 chunks of 512 over 1536 (small: 16 + 2x128/384)", () => {
  const big = mixedOf(false), small = mixedOf(true);
  assert.equal(shapeName(big), "mixed 32x2048 + 2x512/1536 32q/8kv d128 bs16 f16");
  assert.equal(shapeName(small), "mixed 16x1024 + 2x128/384 16q/4kv d128 bs16 f16");
  assert.deepEqual(shapeParts(big), [
    { reqs: 32, ctx: 2048, qlen: 1 },
    { reqs: 2, ctx: 2048, qlen: 512 },
  ]);
  assert.equal(big.kv_cache_dtype, "auto");
  // `--shapes` picks it by name; the other shapes' usual regexes leave it out.
  const names = benchShapes(false).map(shapeName);
  assert.deepEqual(names.filter((n) => /^mixed/.test(n)), [shapeName(big)]);
  assert.ok(!/^decode|^prefill|causal/.test(shapeName(big)));
  // Work: the sum of the parts'; the decode part's K+V and the chunks' causal flops.
  const p = mixedParts(big)!;
  assert.deepEqual([p.decode.kind, p.decode.reqs, p.decode.ctx, p.decode.qlen], [
    "decode",
    32,
    2048,
    1,
  ]);
  assert.deepEqual([p.prefill.kind, p.prefill.reqs, p.prefill.ctx, p.prefill.qlen], [
    "prefill",
    2,
    2048,
    512,
  ]);
  const [w, d, c] = [work(big), work(p.decode), work(p.prefill)];
  assert.equal(d.kv_bytes, 32 * 2048 * 8 * 128 * 2 * 2);
  let chunk = 0;
  for (let j = 0; j < 512; j++) chunk += 4 * (1536 + j + 1) * 32 * 128;
  assert.equal(c.flops, 2 * chunk);
  assert.deepEqual(w, { kv_bytes: d.kv_bytes + c.kv_bytes, flops: d.flops + c.flops });
  assert.equal(mixedParts(benchShapes(false)[0]), null, "a decode shape has no parts");
});

Deno.test("mixed shape: the --small batch, validated and run through CPU_REFERENCE", async () => {
  const s = mixedOf(true);
  const data = makeBatch(s);
  const md = data.batch.metadata;
  const H = s.num_heads, D = s.head_size, bs = s.block_size;
  assert.equal(md.num_reqs, 18);
  assert.deepEqual([...md.query_start_loc].slice(14), [14, 15, 16, 144, 272]);
  assert.equal(data.batch.num_tokens, 272);
  assert.deepEqual([...md.seq_lens], [...Array(16).fill(1024), 512, 512]);
  assert.equal(md.max_blocks_per_req, 64);
  assert.equal(data.selector.max_query_len, 128);
  assert.equal(data.spec.num_blocks, 1 + 16 * 64 + 2 * 32);
  // Each request its own blocks (none shared across requests, block 0 only as padding), each
  // new token's slot at its position (seq_len - qlen + j) in its request's blocks.
  const used = new Set<number>();
  for (let r = 0; r < md.num_reqs; r++) {
    const row = md.block_table.subarray(r * 64, (r + 1) * 64);
    const need = Math.ceil(md.seq_lens[r] / bs);
    for (let j = 0; j < 64; j++) {
      if (j >= need) {
        assert.equal(row[j], 0, "padding");
        continue;
      }
      assert.ok(row[j] > 0 && !used.has(row[j]), `request ${r} block ${j}: ${row[j]}`);
      used.add(row[j]);
    }
    const q0 = md.query_start_loc[r], n = md.query_start_loc[r + 1] - q0;
    for (let j = 0; j < n; j++) {
      const p = md.seq_lens[r] - n + j;
      assert.equal(md.slot_mapping[q0 + j], row[Math.floor(p / bs)] * bs + (p % bs));
    }
  }
  assert.equal(used.size, data.spec.num_blocks - 1);

  const cpu = cpuReference(new CpuWorkerPool({ size: 1 }));
  const cache = await cpu.importCache(data.spec, data.key, data.value, { gpu: null });
  try {
    const batch = validHostBatch(data.batch, cache); // the service's own checks
    const r = await cpu.run(await cpu.plan(batch, { gpu: null }), batch, { gpu: null });
    const out = toFloat32(r.output);
    assert.equal(out.length, 272 * H * D);
    assert.ok(out.every(Number.isFinite), "a finite output");
    assert.ok(out.some((x) => x !== 0));
  } finally {
    cache.destroy();
    await cpu.close();
  }
});

/** bench/decode_geometry.ts's H200 stand-in (no device), with or without subgroup matrices. */
function fakeGpu(mma: boolean): GpuContext {
  if (!mma) return H200_LIKE;
  const configs = [{ component_type: "f16", result_component_type: "f32", m: 16, n: 16, k: 16 }];
  return {
    ...H200_LIKE,
    adapter_info: { ...H200_LIKE.adapter_info, subgroup_matrix_configs: configs },
    features: new Set([...H200_LIKE.features, MMA_FEATURE]),
  } as GpuContext;
}

Deno.test("mixed shape: WEBGPU_FLASH splits it by row; the bench's parts follow the passes", async () => {
  const data = makeBatch(mixedOf(true));
  const cpu = cpuReference(new CpuWorkerPool({ size: 1 }));
  const cache = await cpu.importCache(data.spec, data.key, data.value, { gpu: null });
  try {
    const shape = validHostBatch(data.batch, cache);
    const opts = resolveFlashOptions({
      tile: null,
      decode: { ...DEFAULT_DECODE_TUNING },
      mma: true,
      prefill_split: true,
    });
    const rows = Array.from({ length: 18 }, (_, i) => i);
    const mma = flashRouting(fakeGpu(true), opts, shape);
    assert.equal(mma.paths.header, "decode=split_kv, prefill=tensor_core");
    assert.deepEqual(rows.map(mma.isDecode), rows.map((i) => i < 16));
    // Without subgroup matrices the chunks go to the split-KV kernels too: one set of passes.
    const split = flashRouting(fakeGpu(false), opts, shape);
    assert.equal(split.paths.header, "decode=split_kv, prefill=split_kv");
    assert.ok(rows.every(split.isDecode));
  } finally {
    cache.destroy();
    await cpu.close();
  }
  assert.deepEqual(partsOf({ decode_split: 0.2, decode_reduce: 0.05, prefill_mma: 0.5 }), {
    decode_ms: 0.25,
    prefill_ms: 0.5,
  });
  assert.deepEqual(partsOf({ decode_split: 0.3, prefill: 0.7 }), {
    decode_ms: 0.3,
    prefill_ms: 0.7,
  });
  assert.equal(partsOf({ decode_split: 0.9, decode_reduce: 0.1 }), null, "together");
  assert.equal(partsOf({ decode_split: 0.9, prefill: 0.1, other: 1 }), null, "unknown pass");
});
