/**
 * Checks the oracle itself: CPU_REFERENCE against the deliberately naive float64 attention
 * of tests/support/naive.ts (written from the contract alone) on a handful of varied
 * batches — output, lse and the caches after the write. Fresh random data every run; the
 * seed is printed (SEED reproduces it).
 * @module
 */
import { toFloat32 } from "../../core/data.ts";
import { validHostBatch } from "../../service/host_input.ts";
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { decode } from "../../core/dtype.ts";
import type { KvCache } from "../../core/types.ts";
import { type BatchSpec, deriveSeed, generateBatch } from "../support/batches.ts";
import { assertClose } from "../support/compare.ts";
import { naiveAttention } from "../support/naive.ts";

const SEED = Deno.env.get("SEED") !== undefined
  ? Number(Deno.env.get("SEED")) >>> 0
  : crypto.getRandomValues(new Uint32Array(1))[0];

const base: BatchSpec = {
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 16,
  head_size: 32,
  num_heads: 4,
  num_kv_heads: 2,
  requests: [
    { query_len: 1, seq_len: 29 },
    { query_len: 6, seq_len: 21, pad: 2 },
    { query_len: 13, seq_len: 13 },
  ],
};

const CASES: [string, Partial<BatchSpec>][] = [
  ["mixed f32 NHD bs16 sinks +lse", { sinks: true, return_lse: true }],
  ["chunked f32 HND bs32 window+alibi +lse", {
    layout: "HND",
    block_size: 32,
    sliding_window: 7,
    alibi: true,
    return_lse: true,
    num_heads: 8,
    num_kv_heads: 1,
    requests: [{ query_len: 9, seq_len: 50 }, { query_len: 1, seq_len: 40 }],
  }],
  ["decode bf16 kv fp8_e5m2 scales, soft cap +lse", {
    dtype: "bfloat16",
    kv_cache_dtype: "fp8_e5m2",
    k_scale: 0.5,
    v_scale: 2,
    logits_soft_cap: 1.2,
    q_std: 3,
    return_lse: true,
    requests: [{ query_len: 1, seq_len: 33 }, { query_len: 1, seq_len: 1, pad: 1 }, {
      query_len: 1,
      seq_len: 64,
    }],
  }],
  ["encoder f32 gqa4 +lse", {
    attn_type: "encoder",
    return_lse: true,
    requests: [{ query_len: 10, seq_len: 10 }, { query_len: 17, seq_len: 17 }],
  }],
  ["encoder_decoder f16 writing, HND", {
    attn_type: "encoder_decoder",
    dtype: "float16",
    layout: "HND",
    requests: [{ query_len: 2, seq_len: 19, pad: 3 }, { query_len: 1, seq_len: 7 }],
  }],
  ["prefill f32 non-causal decoder, padding", {
    causal: false,
    requests: [{ query_len: 12, seq_len: 12, pad: 3 }, { query_len: 5, seq_len: 5 }],
  }],
  ["non-causal decoder window: |p - k| < w", {
    causal: false,
    sliding_window: 4,
    return_lse: true,
    requests: [{ query_len: 12, seq_len: 12 }, { query_len: 5, seq_len: 20 }],
  }],
  ["encoder_only f32 window +lse", {
    attn_type: "encoder_only",
    sliding_window: 3,
    return_lse: true,
    requests: [{ query_len: 9, seq_len: 9 }, { query_len: 4, seq_len: 4 }],
  }],
  ["mixed f16 kv fp8_e4m3 HND bs64 d128 sinks", {
    dtype: "float16",
    kv_cache_dtype: "fp8_e4m3",
    k_scale: 0.75,
    layout: "HND",
    block_size: 64,
    head_size: 128,
    sinks: true,
  }],
];

Deno.test("reference cross-check: CPU_REFERENCE vs the naive contract", async (t) => {
  console.log(`reference cross-check seed ${SEED} (rerun: SEED=${SEED})`);
  for (const [name, over] of CASES) {
    await t.step(name, async () => {
      const g = generateBatch({ ...base, ...over }, deriveSeed(SEED, name));
      const naive = naiveAttention(
        g.batch,
        g.cache_spec ? { spec: g.cache_spec, key: g.key_cache, value: g.value_cache } : null,
      );
      let cache: KvCache | null = null;
      if (g.cache_spec) {
        cache = await CPU_REFERENCE.importCache(
          g.cache_spec,
          g.key_cache.slice(),
          g.value_cache.slice(),
          { gpu: null },
        );
      }
      const batch = validHostBatch(g.batch, cache);
      const ctx = { gpu: null };
      const run = await CPU_REFERENCE.run(await CPU_REFERENCE.plan(batch, ctx), batch, ctx);
      const res = { output: toFloat32(run.output), lse: run.lse };
      const H = g.batch.layer.num_heads, T = g.batch.num_tokens;
      // Both are float64 then rounded to the dtype: at most one rounding step apart.
      const tol = g.batch.dtype === "float32"
        ? { atol: 1e-6, rtol: 1e-6 }
        : { atol: 1e-3, rtol: 8e-3 };
      assertClose(res.output, naive.output, {
        ...tol,
        shape: g.output_shape,
        label: `${name} output`,
      });
      if (g.batch.return_lse) {
        assert.ok(res.lse, "lse was asked for");
        assertClose(res.lse, naive.lse, {
          atol: 1e-5,
          rtol: 1e-6,
          shape: [H, T],
          label: `${name} lse`,
        });
      }
      if (cache) {
        const after = await cache.read();
        const st = g.storage!;
        const exact = { atol: 0, rtol: 0, equal_nan: true, shape: g.cache_shape };
        assertClose(decode(st, after.key), naive.key_cache, {
          ...exact,
          label: `${name} key_cache`,
        });
        assertClose(decode(st, after.value), naive.value_cache, {
          ...exact,
          label: `${name} value_cache`,
        });
        cache.destroy();
      }
    });
  }
});
