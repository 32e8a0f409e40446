/**
 * The subgroup-matrix prefill kernel (wgsl/flash_mma.wgsl through gpu/flash_mma_launch.ts)
 * against CPU_REFERENCE on fresh random hostile batches: causal prefill, mixed prefill +
 * decode rows, GQA groups 1/4/8, head sizes 64/128/256, soft cap, ALiBi, sinks, sliding
 * windows, LSE, f16/bf16 data, f16/bf16/fp8/f32 caches (bf16 and f32 values beyond f16's
 * range clamp to +-65504), NHD and HND, padding slots, a multi-chunk cache, encoder,
 * encoder_only and encoder_decoder, several kernel shapes and the exact-FA2 rescale
 * (tau 0). Needs a Dawn device with `chromium-experimental-subgroup-matrix`
 * (gpu/flash_mma_device.ts); skipped with the stated reason anywhere else (CI, Deno's own
 * WebGPU). Run with --allow-all (Dawn is a Node-API addon: --allow-ffi).
 */
import assert from "node:assert/strict";
import { chooseMmaShape, type MmaShape, mmaShapeProblem } from "../../gpu/flash_mma_codegen.ts";
import { acquireMmaDevice } from "../../gpu/flash_mma_device.ts";
import { buildMmaMeta } from "../../gpu/flash_mma_launch.ts";
import type { BatchSpec } from "../support/batches.ts";
import { checkMma, type MmaCaseOptions } from "../support/mma_case.ts";

/** A fresh random seed (each failure names it). */
const freshSeed = () => (Math.random() * 2 ** 32) >>> 0;

const acquired = await acquireMmaDevice();
const ctx = acquired.ctx;
const SKIP = ctx === null;
if (SKIP) console.warn(`flash_mma tests skipped: ${acquired.reason}`);

const base = (o: Partial<BatchSpec>): BatchSpec => ({
  dtype: "float16",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 16,
  head_size: 64,
  num_heads: 8,
  num_kv_heads: 2,
  requests: [{ query_len: 29, seq_len: 29 }],
  return_lse: true,
  ...o,
});

/** Kernel shapes by name; `default` is what chooseMmaShape picks for the case. */
type ShapeName = "default" | "wide" | "rm2" | "fa2" | "bk64";
const SHAPES: Record<Exclude<ShapeName, "default">, Omit<MmaShape, "bk"> & { bk?: number }> = {
  wide: { nsg: 4, rm: 1, tau: 8 },
  rm2: { nsg: 2, rm: 2, tau: 8 },
  fa2: { nsg: 2, rm: 1, tau: 0 },
  bk64: { nsg: 2, rm: 1, bk: 64, tau: 8 },
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
    "bk64",
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
    "f32 cache beyond f16 range: clamped",
    base({
      dtype: "float32",
      requests: [{ query_len: 6, seq_len: 26 }],
    }),
    "default",
    { plant: 1e6 },
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

function shapeFor(s: BatchSpec, name: ShapeName, storage: boolean): MmaShape {
  const spec = {
    head_size: s.head_size,
    dtype: "float16" as const,
    storage: storage ? "float16" as const : null,
    layout: s.layout,
    block_size: s.block_size,
    nchunk: 1,
    subgroup_size: ctx!.subgroup_size,
    dims: ctx!.mma,
  };
  const limit = ctx!.limits.maxComputeWorkgroupStorageSize;
  if (name === "default") return chooseMmaShape(spec, limit)!;
  const o = SHAPES[name];
  const bk = o.bk ?? chooseMmaShape(spec, limit)!.bk;
  const shape = { ...o, bk };
  assert.equal(mmaShapeProblem(spec, shape, limit), null);
  return shape;
}

for (const [name, spec, shapeName, opts] of CASES) {
  Deno.test({
    name: `flash_mma vs reference: ${name}`,
    ignore: SKIP,
    sanitizeOps: false,
    sanitizeResources: false,
    fn: async () => {
      const enc = spec.attn_type === "encoder" || spec.attn_type === "encoder_only";
      const shape = shapeFor(spec, shapeName, !enc);
      await checkMma(ctx!, spec, freshSeed(), { shape, ...opts });
    },
  });
}

Deno.test("flash_mma: tiles hold (token, head) rows of one GQA group, longest first", () => {
  const L = { num_heads: 8, num_kv_heads: 2, attn_type: "decoder", causal: true };
  const md = {
    num_reqs: 2,
    query_start_loc: Int32Array.of(0, 1, 11),
    seq_lens: Int32Array.of(40, 10),
    block_table: new Int32Array(6),
    max_blocks_per_req: 3,
    slot_mapping: new Int32Array(11),
  };
  const m = buildMmaMeta({ layer: L, metadata: md } as never, 16);
  // G = 4: 4 tokens a tile; request 1 (10 tokens) -> 3 tiles; request 0 (decode) -> 1.
  assert.equal(m.numTiles, 4);
  const tiles = Array.from({ length: 4 }, (_, i) => Array.from(m.meta.subarray(4 * i, 4 * i + 4)));
  assert.deepEqual(tiles[0], [0, 0, 1 | (4 << 16), 0]); // 40 visible keys: first
  assert.deepEqual(tiles.slice(1).map((t) => t[2] & 0xffff).sort(), [2, 4, 4]);
});
