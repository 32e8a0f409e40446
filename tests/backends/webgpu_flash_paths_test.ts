/**
 * WEBGPU_FLASH records which kernels run each part of a batch, and why not the preferred ones
 * (backends/webgpu_flash.ts `flashRouting`), from the shape and the device's features and limits
 * alone: fake contexts (no device), one like an H200 under Dawn (f16 -> f32 subgroup matrices,
 * subgroup 32) and one like Deno's own WebGPU (no subgroup-matrix feature). The header values
 * are made once, with the plan. Runs everywhere (no GPU needed).
 */
import assert from "node:assert/strict";
import {
  type FlashOptions,
  flashRouting,
  resolveFlashOptions,
  splitDispatches,
} from "../../backends/webgpu_flash.ts";
import { type DecodeTuning, DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import {
  PREFILL_GPU_KEYS_PER_ITER,
  PREFILL_GPU_TUNING,
  PREFILL_WG_TOKENS,
  prefillSplitTuning,
} from "../../backends/prefill_split_tuning.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import type { BatchShape, GpuContext } from "../../core/types.ts";
import { planPaths } from "../../core/backend_types.ts";
import { validHostBatch } from "../../service/host_input.ts";
import { type BatchSpec, generateBatch, smallSpec } from "../support/batches.ts";
import { fakeMmaContext } from "../support/fake_device.ts";
import { withEnv } from "../support/env.ts";

const WITH_MMA = fakeMmaContext(true);
const NO_MMA = fakeMmaContext(false);

const OPTS: FlashOptions = {
  tile: null,
  decode: { ...DEFAULT_DECODE_TUNING },
  mma: true,
  prefill_split: true,
};

/** The shape of a generated batch over its (host) cache, as the service plans it. */
function shape(o: Partial<BatchSpec>): BatchShape {
  const g = generateBatch(
    smallSpec({ dtype: "float16", head_size: 128, requests: [], ...o }),
    1,
  );
  const cache = g.cache_spec
    ? HostKvCache.fromBytes(g.cache_spec, g.key_cache, g.value_cache)
    : null;
  return validHostBatch(g.batch, cache);
}

const MIXED = [
  { query_len: 1, seq_len: 40 },
  { query_len: 17, seq_len: 30 },
  { query_len: 0, seq_len: 9 },
  { query_len: 1, seq_len: 5 },
];
const NO_SM = "subgroup matrices not supported (feature chromium-experimental-subgroup-matrix " +
  "not granted)";
const F32 = "dtype not supported (got float32; supported: float16, bfloat16)";

/** PREFILL_GPU_TUNING's fields at their defaults. */
const PREFILL_GPU_OFF = Object.fromEntries(
  Object.keys(PREFILL_GPU_TUNING).map((k) => [k, DEFAULT_DECODE_TUNING[k as keyof DecodeTuning]]),
);

Deno.test("flash paths: a mixed f16 batch where subgroup matrices exist: tensor core", () => {
  const s = shape({ requests: MIXED });
  const r = flashRouting(WITH_MMA, resolveFlashOptions(OPTS), s);
  assert.ok(r.mma, "the tensor-core kernel runs the prefill rows");
  assert.deepEqual(r.paths.parts, [
    { part: "decode", path: "split_kv" },
    { part: "prefill", path: "tensor_core" },
  ]);
  assert.equal(r.paths.header, "decode=split_kv, prefill=tensor_core");
  assert.equal(r.paths.reasons_header, "");
  assert.deepEqual([0, 1, 2, 3].map(r.isDecode), [true, false, true, true]);
});

Deno.test("flash paths: a mixed batch on an adapter without subgroup matrices", () => {
  const s = shape({ requests: MIXED });
  // The default: the prefill rows on the split-KV kernels, each token a decode row.
  const r = flashRouting(NO_MMA, resolveFlashOptions(OPTS), s);
  assert.equal(r.mma, null);
  assert.deepEqual(r.paths.parts, [
    { part: "decode", path: "split_kv" },
    { part: "prefill", path: "split_kv", reason: NO_SM },
  ]);
  assert.equal(r.paths.header, "decode=split_kv, prefill=split_kv");
  assert.equal(r.paths.reasons_header, `prefill="${NO_SM}"`);
  assert.deepEqual([0, 1, 2, 3].map(r.isDecode), [true, true, true, true]);
  // prefill_split off: the portable tiles, the same reason.
  const t = flashRouting(NO_MMA, resolveFlashOptions({ ...OPTS, prefill_split: false }), s);
  assert.equal(t.paths.header, "decode=split_kv, prefill=tiles");
  assert.equal(t.paths.reasons_header, `prefill="${NO_SM}"`);
  assert.deepEqual([0, 1, 2, 3].map(t.isDecode), [true, false, true, true]);
  // The feature granted but no f16 -> f32 configuration, or no single subgroup size.
  const noConfig = { ...WITH_MMA, adapter_info: { ...WITH_MMA.adapter_info } } as GpuContext;
  (noConfig.adapter_info as { subgroup_matrix_configs?: unknown[] }).subgroup_matrix_configs = [];
  assert.match(
    flashRouting(noConfig, resolveFlashOptions(OPTS), s).paths.parts[1].reason ?? "",
    /^subgroup matrices not supported \(no f16 -> f32 subgroup-matrix configuration\)$/,
  );
  const varying = {
    ...WITH_MMA,
    adapter_info: { ...WITH_MMA.adapter_info, subgroup_min_size: 8 },
  } as GpuContext;
  assert.equal(
    flashRouting(varying, resolveFlashOptions(OPTS), s).paths.parts[1].reason,
    "subgroup matrices not supported (subgroup size not fixed (min 8, max 32))",
  );
});

Deno.test("flash paths: f32 data keeps the prefill rows off the tensor core", () => {
  const s = shape({ dtype: "float32", requests: MIXED });
  const r = flashRouting(WITH_MMA, resolveFlashOptions(OPTS), s);
  assert.equal(r.mma, null);
  assert.deepEqual(r.paths.parts, [
    { part: "decode", path: "split_kv" },
    { part: "prefill", path: "split_kv", reason: F32 },
  ]);
  assert.equal(r.paths.reasons_header, `prefill="${F32}"`);
  // Prefill alone, tiles.
  const p = flashRouting(
    WITH_MMA,
    resolveFlashOptions({ ...OPTS, prefill_split: false }),
    shape({ dtype: "float32", requests: [{ query_len: 9, seq_len: 9 }] }),
  );
  assert.equal(p.paths.header, "prefill=tiles");
  assert.equal(p.paths.reasons_header, `prefill="${F32}"`);
});

Deno.test("flash paths: a decode-only batch: split-KV, no reason, on either adapter", () => {
  const s = shape({
    dtype: "float32",
    requests: [{ query_len: 1, seq_len: 33 }, { query_len: 1, seq_len: 2 }],
  });
  for (const ctx of [WITH_MMA, NO_MMA]) {
    const r = flashRouting(ctx, resolveFlashOptions(OPTS), s);
    assert.deepEqual(r.paths.parts, [{ part: "decode", path: "split_kv" }]);
    assert.equal(r.paths.header, "decode=split_kv");
    assert.equal(r.paths.reasons_header, "");
  }
});

Deno.test("flash paths: the switch, the kernel's limits, decode rows the split kernels refuse", async () => {
  const mixed = shape({ requests: MIXED });
  const off = flashRouting(WITH_MMA, resolveFlashOptions({ ...OPTS, mma: false }), mixed);
  assert.equal(off.paths.parts[1].reason, "tensor-core kernel disabled (option mma: false)");
  await withEnv({ ATTN_PREFILL_MMA: "0" }, () => {
    const { mma: _, ...rest } = OPTS;
    const env = flashRouting(WITH_MMA, resolveFlashOptions(rest), mixed);
    assert.equal(env.paths.parts[1].path, "split_kv");
    assert.equal(env.paths.parts[1].reason, "tensor-core kernel disabled (ATTN_PREFILL_MMA=0)");
  });
  // Too little workgroup memory for any shape at head size 256.
  const small = fakeMmaContext(true, { maxComputeWorkgroupStorageSize: 4096 });
  const big = flashRouting(
    small,
    resolveFlashOptions(OPTS),
    shape({ head_size: 256, requests: MIXED }),
  );
  assert.equal(big.mma, null);
  assert.match(
    big.paths.parts[1].reason ?? "",
    /^workgroup memory not sufficient \(no kernel shape fits head_size 256 in 4096 B of workgroup memory\)$/,
  );
  // Head size 32: no split-KV kernel; every row on the tensor core, the decode rows with why.
  const hd32 = flashRouting(
    WITH_MMA,
    resolveFlashOptions(OPTS),
    shape({ head_size: 32, requests: MIXED }),
  );
  assert.ok(hd32.mma);
  assert.deepEqual(hd32.paths.parts, [
    {
      part: "decode",
      path: "tensor_core",
      reason: "head_size not supported (got 32; supported: 64, 80, 96, 112, 128, 192, 256)",
    },
    { part: "prefill", path: "tensor_core" },
  ]);
  // An encoder on Deno's WebGPU: all on the tiles.
  const enc = flashRouting(
    NO_MMA,
    resolveFlashOptions(OPTS),
    shape({
      attn_type: "encoder_only",
      requests: [{ query_len: 1, seq_len: 1 }, {
        query_len: 6,
        seq_len: 6,
      }],
    }),
  );
  assert.equal(enc.paths.header, "decode=tiles, prefill=tiles");
  assert.equal(
    enc.paths.reasons_header,
    'decode="attention type encoder_only not supported (the split-KV kernels read the paged ' +
      `cache)", prefill="${NO_SM}"`,
  );
});

Deno.test("flash paths: header values are RFC 8941 (escaped, ASCII), empty without rows", () => {
  const p = planPaths([
    { part: "decode", path: "split_kv" },
    { part: "prefill", path: "tiles", reason: 'a "quoted" \\ reason \u00e9' },
  ]);
  assert.equal(p.header, "decode=split_kv, prefill=tiles");
  assert.equal(p.reasons_header, 'prefill="a \\"quoted\\" \\\\ reason ?"');
  const none = flashRouting(
    WITH_MMA,
    resolveFlashOptions(OPTS),
    shape({ requests: [{ query_len: 0, seq_len: 4 }] }),
  );
  assert.deepEqual(none.paths, { parts: [], header: "", reasons_header: "" });
});

Deno.test("flash paths: prefill rows on the split-KV kernels take the prefill tuning", () => {
  const o = resolveFlashOptions(OPTS);
  const mixed = shape({ requests: MIXED });
  const decodes = shape({
    requests: [{ query_len: 1, seq_len: 40 }, { query_len: 1, seq_len: 9 }],
  });
  // Deno's runtime: the prefill rows join the decode rows on the split kernels.
  assert.equal(flashRouting(NO_MMA, o, mixed).prefillOnSplit, true);
  assert.equal(flashRouting(NO_MMA, o, decodes).prefillOnSplit, false);
  // Tensor cores take the prefill rows; without prefill_split the portable tiles do.
  assert.equal(flashRouting(WITH_MMA, o, mixed).prefillOnSplit, false);
  const tiles = resolveFlashOptions({ ...OPTS, prefill_split: false });
  assert.equal(flashRouting(NO_MMA, tiles, mixed).prefillOnSplit, false);
  // A software adapter's (lavapipe's) prefill rows: the transposed sums, 4 tokens, 8 keys a
  // step where keys_per_iter is automatic on GPUs; nothing else changed.
  const t = prefillSplitTuning(DEFAULT_DECODE_TUNING, true);
  assert.equal(t.scatter_sums && t.scatter_softmax, true);
  assert.equal(t.wg_tokens, PREFILL_WG_TOKENS);
  assert.equal(t.gpu_keys_per_iter, PREFILL_GPU_KEYS_PER_ITER);
  const unchanged = { scatter_sums: false, scatter_softmax: false, wg_tokens: 1 };
  assert.deepEqual({ ...t, ...unchanged, gpu_keys_per_iter: 0 }, DEFAULT_DECODE_TUNING);
  // A GPU's: PREFILL_GPU_TUNING's fields too.
  const g = prefillSplitTuning(DEFAULT_DECODE_TUNING, false);
  assert.deepEqual({ ...g, ...PREFILL_GPU_TUNING }, g);
  assert.deepEqual({ ...g, ...unchanged, gpu_keys_per_iter: 0, ...PREFILL_GPU_OFF }, {
    ...DEFAULT_DECODE_TUNING,
  });
  // A tuning that names more tokens keeps them.
  const wt8 = { ...DEFAULT_DECODE_TUNING, wg_tokens: 8 };
  assert.equal(prefillSplitTuning(wt8, false).wg_tokens, 8);
  // And the keys a step it names (the review of session 33: they were overwritten with 8).
  const named = { ...DEFAULT_DECODE_TUNING, gpu_keys_per_iter: 2 };
  assert.equal(prefillSplitTuning(named, false).gpu_keys_per_iter, 2);
  // And the GPU fields it sets to anything but their defaults.
  const lanes = { ...DEFAULT_DECODE_TUNING, max_lanes: 16, workgroup_size: 128 };
  const kept = prefillSplitTuning(lanes, false);
  assert.deepEqual([kept.max_lanes, kept.workgroup_size, kept.longest_first], [16, 128, true]);
});

Deno.test("flash paths: a mixed batch on the split-KV kernels runs its decode and prefill rows as two dispatches", () => {
  const o = resolveFlashOptions(OPTS);
  const which = (s: BatchShape, mma: GpuContext) => {
    const r = flashRouting(mma, o, s);
    const [a, b] = splitDispatches(s, r.isDecode, r.prefillOnSplit, PREFILL_WG_TOKENS);
    const n = s.metadata.num_reqs;
    const reqs = (f: ((i: number) => boolean) | null) =>
      f ? Array.from({ length: n }, (_, i) => i).filter(f) : null;
    return [reqs(a), reqs(b)];
  };
  // Deno's runtime, mixed: the short requests (0 and 3, and the empty 2, which has no rows),
  // then the long one (1).
  assert.deepEqual(which(shape({ requests: MIXED }), NO_MMA), [[0, 2, 3], [1]]);
  // One dispatch where one kind is missing, or the tensor cores take the prefill rows.
  const prefills = shape({
    requests: [{ query_len: 17, seq_len: 30 }, { query_len: 0, seq_len: 9 }],
  });
  assert.deepEqual(which(prefills, NO_MMA), [[0, 1], null]);
  const decodes = shape({
    requests: [{ query_len: 1, seq_len: 40 }, { query_len: 1, seq_len: 9 }],
  });
  assert.deepEqual(which(decodes, NO_MMA), [[0, 1], null]);
  assert.deepEqual(which(shape({ requests: MIXED }), WITH_MMA), [[0, 2, 3], null]);
  // A short prefill (a speculative step of 3) goes with the decode rows: with the long ones it
  // would cost them their 4 tokens a workgroup (the review of the split).
  const spec = shape({
    requests: [{ query_len: 1, seq_len: 40 }, { query_len: 3, seq_len: 30 }, {
      query_len: 17,
      seq_len: 30,
    }],
  });
  assert.deepEqual(which(spec, NO_MMA), [[0, 1], [2]]);
  const shortOnly = shape({
    requests: [{ query_len: 1, seq_len: 40 }, { query_len: 2, seq_len: 30 }],
  });
  assert.deepEqual(which(shortOnly, NO_MMA), [[0, 1], []]);
});

Deno.test("flash paths: decode rows take the split-KV kernels at every block size WEBGPU_DECODE takes", () => {
  // Before: only 16, 32 and 64 exactly; 48, 80 and 128 (multiples, which WEBGPU_DECODE runs
  // and vLLM's rule admits) sent the decode rows to the portable tiles, about 13x slower.
  const o = resolveFlashOptions(OPTS);
  const decodes = (block_size: number) =>
    shape({ block_size, requests: [{ query_len: 1, seq_len: 200 }, { query_len: 1, seq_len: 9 }] });
  for (const bs of [16, 48, 80, 128]) {
    assert.equal(flashRouting(NO_MMA, o, decodes(bs)).paths.header, "decode=split_kv", `${bs}`);
  }
  const r = flashRouting(NO_MMA, o, decodes(8));
  assert.equal(r.paths.header, "decode=tiles");
  assert.match(r.paths.reasons_header, /block_size not supported \(got 8; supported: 16, 32, 64\)/);
});
