/**
 * WEBGPU_DECODE's issue-8 knobs against CPU_REFERENCE on fresh random hostile batches (permuted
 * block table, NaN in unread slots, outputs poisoned): `direct_single` (rows cut into one slice
 * write their output from the split pass), `fused_reduce` (the last workgroup of a row merges
 * the partials: one dispatch), `stage_table` (block-table entries in workgroup memory),
 * `stage_kv` (K/V tiles streamed through workgroup memory), the v0.6 ALU knobs, and the `waves`
 * slice policy. Every knob runs on the GPU kernel shape (several key groups a
 * workgroup) over batches with window, soft cap, ALiBi, sinks, LSE, fp8 / bf16 / f32 caches,
 * HND and NHD, and rows of several slices beside rows of one; the plan's counts prove which
 * path ran. The fused reduce also runs repeatedly, interleaved with other plans and
 * concurrently: its device-owned partials must be back to zero after every dispatch
 * (wgsl/decode_fused.wgsl), and a stale word would show as a wrong row in a later call.
 */
import assert from "node:assert/strict";
import {
  type DecodeTuning,
  DEFAULT_DECODE_TUNING,
  makeWebGpuDecode,
} from "../../backends/webgpu_decode.ts";
import type { AttentionBackend, GpuContext, KvCacheSpec, LayerSpec } from "../../core/types.ts";
import { sliceCount, sliceLength } from "../../backends/decode_split_policy.ts";
import { decodeShape, epilogueMode } from "../../backends/decode_shape.ts";
import type { BatchSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import {
  BF16_NHD_SPEC,
  decodePlanInfo,
  F32_MHA_SPEC,
  FP8_HND_SPEC,
  KNOB_REQUESTS,
} from "../support/decode_knob_specs.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

/**
 * The GPU kernel shape the expectations below were worked out for: 8 lanes a key row (the
 * subgroup size of lavapipe, where they were written). Unpinned, the H200's 32-lane rows made
 * other slices and tiles (a 17-key row split in two, an f32 tile under stage_kv_bytes) and 11
 * plan-count assertions failed there although every output was right.
 */
const GPU_SHAPE = { workgroup_size: 128, keys_per_iter: 4, kv_heads_per_group: 1, max_lanes: 8 };
const MANY = { target_workgroups: 4096, wave_workgroups: 528, min_split_keys: 16 };
/** Slices of >= 256 keys: a key group runs several steps (MANY gives it one). */
const LONG = { target_workgroups: 4096, wave_workgroups: 528, min_split_keys: 256 };

const SPECS: [string, BatchSpec][] = [
  ["f16, fp8_e4m3 cache, HND, window, sinks, ALiBi, soft cap, LSE", FP8_HND_SPEC],
  ["bf16, bf16 cache, NHD, GQA8 hd64 bs32, sinks, soft cap, LSE, 3-token rows", BF16_NHD_SPEC],
  ["f32, f32 cache, MHA hd128 bs64, ALiBi, window, LSE", F32_MHA_SPEC],
];

interface Expect {
  epilogue: number;
  /** Staged block-table entries > 0. */
  staged?: boolean;
  /** The K/V tiles staged in workgroup memory (`stage_kv`): always, or "fits": not for the f32
   * cache, whose tile of 16 key groups x 4 keys x 512-byte K and V rows (64 KB) is over
   * `stage_kv_bytes` (plain loads then). */
  stagedKv?: boolean | "fits";
  /** Rows of several slices and rows of one both present (default true). */
  mixed?: boolean;
}

const KNOBS: [string, Partial<DecodeTuning>, Expect][] = [
  ["direct_single off (every slice a partial, reduce pass)", { direct_single: false }, {
    epilogue: 0,
  }],
  ["direct_single", { direct_single: true }, { epilogue: 1 }],
  ["fma_dots off (s += dot(q, k), a += p * x)", { fma_dots: false }, { epilogue: 1 }],
  ["fma_dots off, scatter_softmax, long slices", {
    fma_dots: false,
    scatter_softmax: true,
    ...LONG,
  }, { epilogue: 1 }],
  ["fused_reduce", { fused_reduce: true }, { epilogue: 2 }],
  ["stage_table", { stage_table: true }, { epilogue: 1, staged: true }],
  ["fused_reduce + stage_table + prefetch", {
    fused_reduce: true,
    stage_table: true,
    prefetch: true,
  }, { epilogue: 2, staged: true }],
  ["scatter_sums", { scatter_sums: true }, { epilogue: 1 }],
  ["scatter_sums, 8 keys a step, fused_reduce", {
    scatter_sums: true,
    keys_per_iter: 8,
    fused_reduce: true,
  }, { epilogue: 2 }],
  ["scatter_softmax", { scatter_softmax: true }, { epilogue: 1 }],
  ["scatter_softmax, long slices (many steps a key group: the running max grows)", {
    scatter_softmax: true,
    ...LONG,
  }, { epilogue: 1 }],
  ["scatter_sums, long slices, prefetch", { scatter_sums: true, prefetch: true, ...LONG }, {
    epilogue: 1,
  }],
  ["scatter_softmax, 4 lanes a row (2 heads a lane), 2 keys a step, prefetch, reduce pass", {
    scatter_softmax: true,
    max_lanes: 4,
    keys_per_iter: 2,
    prefetch: true,
    direct_single: false,
    ...LONG,
  }, { epilogue: 0 }],
  ["scatter_softmax, 8 keys a step, fused_reduce, stage_table", {
    scatter_softmax: true,
    keys_per_iter: 8,
    fused_reduce: true,
    stage_table: true,
  }, { epilogue: 2, staged: true }],
  ["fp8_pairs with scatter_softmax, long slices", {
    fp8_pairs: true,
    scatter_softmax: true,
    ...LONG,
  }, { epilogue: 1 }],
  ["fp8_pairs + scatter_softmax, GQA group tiled by 2 heads, long slices", {
    fp8_pairs: true,
    scatter_softmax: true,
    max_heads: 2,
    ...LONG,
  }, { epilogue: 1 }],
  ["indexed_gather + scatter_softmax, long slices", {
    indexed_gather: true,
    scatter_softmax: true,
    ...LONG,
  }, { epilogue: 1 }],
  ["indexed_gather + scatter_sums, 4 lanes a row, 2 keys a step, long slices", {
    indexed_gather: true,
    scatter_sums: true,
    max_lanes: 4,
    keys_per_iter: 2,
    ...LONG,
  }, { epilogue: 1 }],
  ["half_columns + scatter_softmax + fp8_pairs, long slices", {
    half_columns: true,
    scatter_softmax: true,
    fp8_pairs: true,
    ...LONG,
  }, { epilogue: 1 }],
  ["half_columns + prefetch, 4 lanes a row (several half columns a lane), fused_reduce", {
    half_columns: true,
    prefetch: true,
    max_lanes: 4,
    fused_reduce: true,
  }, { epilogue: 2 }],
  ["half_columns, one key group a workgroup (partial stored by each lane), indexed sums", {
    half_columns: true,
    workgroup_size: 8,
    scatter_sums: true,
    indexed_gather: true,
    direct_single: false,
  }, { epilogue: 0 }],
  ["fp8_pairs, one slice a row (no merge: the partial stored by each lane)", {
    fp8_pairs: true,
    workgroup_size: 8,
    direct_single: false,
  }, { epilogue: 0 }],
  ["stage_kv", { stage_kv: true }, { epilogue: 1, stagedKv: "fits" }],
  ["stage_kv, long slices (many tiles a workgroup), stage_table, fused_reduce", {
    stage_kv: true,
    stage_table: true,
    fused_reduce: true,
    ...LONG,
  }, { epilogue: 2, staged: true, stagedKv: "fits" }],
  ["stage_kv + prefetch (ignored), 256 invocations, 2 keys a step, long slices, reduce pass", {
    stage_kv: true,
    prefetch: true,
    workgroup_size: 256,
    keys_per_iter: 2,
    direct_single: false,
    ...LONG,
  }, { epilogue: 0, stagedKv: "fits" }],
  ["stage_kv + half_columns + scatter_softmax, 1 key a step, 4 lanes a row, long slices", {
    stage_kv: true,
    half_columns: true,
    scatter_softmax: true,
    keys_per_iter: 1,
    max_lanes: 4,
    // 32 key groups x 1 key: the f32 tile is 32 KB, at the default limit, so whether it was
    // staged hung on the device's workgroup memory (staged on the H200's 48 KB, not on
    // lavapipe's 32 KB); at 16 KB it is over the limit everywhere, the others' (<= 16 KB) not.
    stage_kv_bytes: 16384,
    ...LONG,
  }, { epilogue: 1, stagedKv: "fits" }],
  ["stage_kv, one key group a workgroup, long slices", {
    stage_kv: true,
    workgroup_size: 8,
    direct_single: false,
    ...LONG,
  }, { epilogue: 0, stagedKv: true }],
  ["stage_kv over its byte limit: plain loads", { stage_kv: true, stage_kv_bytes: 16 }, {
    epilogue: 1,
  }],
  ["waves 2 x 24 workgroups, fused", { waves: 2, wave_workgroups: 24, fused_reduce: true }, {
    epilogue: 2,
  }],
  ["waves of one workgroup, a slice costing more than any row: no split", {
    waves: 1,
    wave_workgroups: 1,
    slice_overhead: 100000,
  }, {
    epilogue: 1,
    mixed: false,
  }],
];

/** What the knobs are tested against: the fixed split target, direct one-slice rows, the
 * separate reduce pass and the word-at-a-time fp8 decoder (the defaults when these tests were
 * written; the registered defaults may differ: `fp8_pairs` and `fused_reduce` are on there, and
 * their own cases turn them on here). */
const KNOB_BASE: DecodeTuning = {
  ...DEFAULT_DECODE_TUNING,
  waves: 0,
  direct_single: true,
  fused_reduce: false,
  fp8_pairs: false,
};

const backendOf = (t: Partial<DecodeTuning>) =>
  makeWebGpuDecode({ ...KNOB_BASE, ...GPU_SHAPE, ...MANY, ...t }) as AttentionBackend;

const planInfo = (b: AttentionBackend, s: BatchSpec) => decodePlanInfo(GPU!, b, s);

for (const [kname, tuning, expect] of KNOBS) {
  for (const [sname, spec] of SPECS) {
    Deno.test(`decode knob ${kname}: ${sname}`, { ignore: NO_GPU }, async () => {
      const b = backendOf(tuning);
      const info = await planInfo(b, spec);
      const what = JSON.stringify(info);
      assert.equal(info.decode_epilogue, expect.epilogue, what);
      assert.equal(info.decode_table_entries > 0, expect.staged ?? false, what);
      const stagedKv = expect.stagedKv === "fits"
        ? spec.kv_cache_dtype !== "auto"
        : expect.stagedKv ?? false;
      assert.equal(info.decode_staged_kv > 0, stagedKv, what);
      if (!(expect.mixed ?? true)) {
        assert.equal(info.decode_items, info.decode_rows, `no row cut (${what})`);
      } else if (expect.epilogue === 0) {
        assert.ok(info.decode_items > info.decode_rows, `rows of several slices (${what})`);
        assert.equal(info.decode_split_rows, info.decode_rows, `every row reduced (${what})`);
      } else {
        assert.ok(info.decode_split_rows > 0, `rows of several slices (${what})`);
        assert.ok(info.decode_split_rows < info.decode_rows, `rows of one slice (${what})`);
      }
      await checkBackend(b, GPU!, spec);
    });
  }
}

/** Head size 80 under half columns and 1 key a step: a tile of 2.5 vec4s a invocation (K and V
 * each), so the last loads are clamped and their stores guarded (gpu/decode_stage.ts). */
const UNEVEN_TILES: [string, BatchSpec][] = [
  ["bf16 cache, NHD, hd80, window, soft cap, LSE", {
    dtype: "bfloat16",
    kv_cache_dtype: "bfloat16",
    layout: "NHD",
    block_size: 16,
    head_size: 80,
    num_heads: 4,
    num_kv_heads: 2,
    requests: KNOB_REQUESTS,
    sliding_window: 500,
    logits_soft_cap: 5,
    return_lse: true,
  }],
  ["fp8_e5m2 cache, HND, hd80, ALiBi, sinks", {
    dtype: "float16",
    kv_cache_dtype: "fp8_e5m2",
    k_scale: 0.25,
    v_scale: 4,
    layout: "HND",
    block_size: 32,
    head_size: 80,
    num_heads: 6,
    num_kv_heads: 2,
    requests: KNOB_REQUESTS,
    alibi: true,
    sinks: true,
  }],
];

for (const [sname, spec] of UNEVEN_TILES) {
  Deno.test(`decode knob stage_kv, uneven tiles: ${sname}`, { ignore: NO_GPU }, async () => {
    const b = backendOf({ stage_kv: true, half_columns: true, keys_per_iter: 1, ...LONG });
    const info = await planInfo(b, spec);
    assert.ok(info.decode_staged_kv > 0, JSON.stringify(info));
    await checkBackend(b, GPU!, spec);
  });
}

Deno.test(
  "decode fused_reduce: repeated and interleaved plans leave the partials clean",
  { ignore: NO_GPU },
  async () => {
    const fused = backendOf({ fused_reduce: true });
    const staged = backendOf({ fused_reduce: true, stage_table: true, waves: 2 });
    for (let r = 0; r < 2; r++) {
      for (const [, spec] of SPECS) {
        await checkBackend(fused, GPU!, spec, { minItems: 4 });
        await checkBackend(staged, GPU!, spec);
      }
    }
  },
);

Deno.test(
  "decode fused_reduce: many rows of many slices at once, three calls (a race shows on GPUs)",
  { ignore: NO_GPU },
  async () => {
    const spec: BatchSpec = {
      ...SPECS[1][1],
      dtype: "float16",
      kv_cache_dtype: "float16",
      requests: Array.from({ length: 40 }, (_, i) => ({ query_len: 1, seq_len: 600 + 53 * i })),
    };
    const fused = backendOf({ fused_reduce: true });
    for (let r = 0; r < 3; r++) await checkBackend(fused, GPU!, spec, { minItems: 400 });
  },
);

Deno.test(
  "decode fp8_pairs: fp8_e5m2 cache (its pair decoder), with and without scatter_softmax",
  { ignore: NO_GPU },
  async () => {
    const spec: BatchSpec = { ...SPECS[0][1], kv_cache_dtype: "fp8_e5m2" };
    for (const t of [{ fp8_pairs: true }, { fp8_pairs: true, scatter_softmax: true, ...LONG }]) {
      await checkBackend(backendOf(t), GPU!, spec, { minItems: 4 });
    }
  },
);

Deno.test("decode fused_reduce: concurrent calls in flight", { ignore: NO_GPU }, async () => {
  const fused = backendOf({ fused_reduce: true });
  await Promise.all(SPECS.map(([, spec]) => checkBackend(fused, GPU!, spec, { minItems: 4 })));
});

const POLICY = { ...KNOB_BASE, min_split_keys: 64 };
const H200_ROWS = { perItem: 8, step: 32, target: 2048, wave: 528 };

Deno.test("decode slice policy: waves 0 keeps the target heuristic", () => {
  const len = sliceLength(POLICY, { ...H200_ROWS, spans: Array(32).fill(2048) });
  assert.equal(len, 256, "65536 keys over 2048 / 8 workgroups, a multiple of 32");
  assert.equal(sliceLength(POLICY, { ...H200_ROWS, spans: [10, 3] }), 64, "min_split_keys");
});

Deno.test("decode slice policy: waves fill the device's waves from the lengths", () => {
  const t = { ...POLICY, waves: 4 };
  const rows = { ...H200_ROWS, wave: 396 };
  // 32 x 2048: 256 uncut workgroups are 0.65 of a wave; 3 slices of 704 fill 1.94 waves.
  const a = sliceLength(t, { ...rows, spans: Array(32).fill(2048) });
  assert.equal(a, 704);
  assert.equal(sliceCount(Array(32).fill(2048), a) * 8, 768);
  // Rows that fill the waves alone (1024 x 512 keys: 8192 workgroups) are not cut.
  assert.equal(sliceLength(t, { ...rows, spans: Array(1024).fill(512) }), 512);
  // Short contexts are not cut: a slice's overhead buys nothing.
  assert.equal(sliceLength(t, { ...rows, spans: [40, 7, 1] }), 64);
  // One long row among short ones is cut; lengths stay multiples of the step.
  const b = sliceLength(t, { ...rows, spans: [30000, 40, 7] });
  assert.ok(b % 32 === 0 && b < 30000 && b >= 64, `${b}`);
  assert.ok(sliceCount([30000, 40, 7], b) * 8 <= 4 * 396, `within the waves cap (${b})`);
});

Deno.test("decode slice policy: a software adapter's wave is its threads, a GPU's 528", () => {
  // lavapipe runs a workgroup a thread: at a GPU's wave of 528 a 16 x 1024 decode was cut into
  // 256 slices and a reduce pass on 2 cores (bench/NOTES.md v0.32).
  const ctx = (description: string, architecture = "") =>
    ({
      adapter_info: { vendor: "", architecture, device: "", description },
      features: new Set(["subgroups", "shader-f16"]),
      limits: { maxComputeWorkgroupStorageSize: 32768, maxStorageBuffersPerShaderStage: 8 },
    }) as unknown as GpuContext;
  const layer = { num_heads: 16, num_kv_heads: 4, head_size: 128 } as LayerSpec;
  const spec = { block_size: 16 } as KvCacheSpec;
  const cpu = decodeShape(
    ctx("llvmpipe (LLVM 15.0.6, 256 bits)"),
    DEFAULT_DECODE_TUNING,
    layer,
    spec,
    "float16",
  );
  const gpu = decodeShape(ctx("NVIDIA H200"), DEFAULT_DECODE_TUNING, layer, spec, "float16");
  assert.equal(cpu.wave, Math.max(1, navigator.hardwareConcurrency ?? 2));
  assert.equal(gpu.wave, 528);
  const set = decodeShape(
    ctx("llvmpipe"),
    { ...DEFAULT_DECODE_TUNING, wave_workgroups: 96 },
    layer,
    spec,
    "float16",
  );
  assert.equal(set.wave, 96, "a tuning's own wave is kept");
  // 16 rows of 1024 keys on 2 threads: uncut (8 waves already); on a GPU's wave: cut.
  const rows = { spans: Array(16).fill(1024), perItem: 1, step: 8, target: 8 };
  assert.equal(sliceLength(DEFAULT_DECODE_TUNING, { ...rows, wave: 2 }), 1024);
  assert.ok(sliceLength(DEFAULT_DECODE_TUNING, { ...rows, wave: 528 }) < 1024);
  // One long row on 2 threads is cut in two, so both run.
  assert.equal(sliceLength(DEFAULT_DECODE_TUNING, { ...rows, spans: [4096], wave: 2 }), 2048);
});

Deno.test("decode epilogue: only GPU shapes with bindings to spare", () => {
  const fake = (perStage: number) =>
    ({
      limits: { maxStorageBuffersPerShaderStage: perStage },
    }) as unknown as GpuContext;
  const shape = {
    sg: true,
    lpk: 16,
    half: false,
    hg: 4,
    tiles: 1,
    kh: 1,
    u: 4,
    wg: 128,
    target: 2048,
    wave: 528,
    skv: 0,
    wh: 1,
    wt: 1,
    shared: 2600,
    shared_limit: 16384,
  };
  const fused = { ...KNOB_BASE, fused_reduce: true };
  assert.equal(epilogueMode(fake(8), fused, shape, 1), 2);
  assert.equal(epilogueMode(fake(8), KNOB_BASE, shape, 1), 1, "direct_single");
  assert.equal(epilogueMode(fake(8), fused, shape, 2), 0, "5 + 2 x 2 chunks > 8 bindings");
  assert.equal(epilogueMode(fake(10), fused, shape, 2), 2);
  assert.equal(epilogueMode(fake(8), fused, { ...shape, wg: 16 }, 1), 0, "one key group");
  assert.equal(
    epilogueMode(fake(8), { ...fused, direct_single: false, fused_reduce: false }, shape, 1),
    0,
  );
});
