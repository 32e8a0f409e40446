/**
 * The conformance cases: a broad matrix of small batches (every data and KV-cache dtype,
 * both layouts, block sizes 16/32/64, head sizes 64/128/256, GQA ratios 1/4/8, decode,
 * prefill, mixed and chunked batches, every attention type, sinks, sliding window, soft
 * cap, ALiBi, LSE, fp8 scales, -1 padding slots) plus a few long-context ones. Small enough
 * that the float64 CPU reference and a software adapter get through all of them in a few
 * minutes; `CONFORMANCE_SCALE=big` adds larger shapes for a real GPU.
 * @module
 */
import type { BatchSpec, RequestSpec } from "../support/batches.ts";

/** One named case. */
export interface ConformanceCase {
  name: string;
  spec: BatchSpec;
}

/** Request patterns (query_len, seq_len). */
const R = {
  decode: (): RequestSpec[] => [
    { query_len: 1, seq_len: 17 },
    { query_len: 1, seq_len: 40 },
    { query_len: 1, seq_len: 5 },
    { query_len: 1, seq_len: 33 },
  ],
  prefill: (): RequestSpec[] => [
    { query_len: 23, seq_len: 23 },
    { query_len: 37, seq_len: 37 },
  ],
  /** Decode, chunked prefill and full prefill together; one prefill has two -1 slots. */
  mixed: (): RequestSpec[] => [
    { query_len: 1, seq_len: 45 },
    { query_len: 7, seq_len: 30, pad: 2 },
    { query_len: 16, seq_len: 16 },
    { query_len: 1, seq_len: 3 },
  ],
  chunked: (): RequestSpec[] => [{ query_len: 12, seq_len: 70 }, { query_len: 1, seq_len: 9 }],
};

const base: BatchSpec = {
  dtype: "float16",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 16,
  head_size: 64,
  num_heads: 8,
  num_kv_heads: 2,
  requests: [],
};

function c(name: string, over: Partial<BatchSpec>): ConformanceCase {
  return { name, spec: { ...base, requests: R.mixed(), ...over } };
}

const DT = { float32: "f32", float16: "f16", bfloat16: "bf16" } as const;

function dtypeMatrix(): ConformanceCase[] {
  const combos: [BatchSpec["dtype"], BatchSpec["kv_cache_dtype"]][] = [
    ["float32", "auto"],
    ["float32", "float16"],
    ["float32", "bfloat16"],
    ["float32", "fp8_e4m3"],
    ["float32", "fp8_e5m2"],
    ["float16", "auto"],
    ["float16", "bfloat16"],
    ["float16", "fp8_e4m3"],
    ["float16", "fp8_e5m2"],
    ["bfloat16", "auto"],
    ["bfloat16", "float16"],
    ["bfloat16", "fp8_e4m3"],
    ["bfloat16", "fp8_e5m2"],
  ];
  return combos.map(([dtype, kv], i) => {
    const fp8 = kv.startsWith("fp8");
    const layout = i % 2 === 0 ? "NHD" : "HND";
    const block_size = [16, 32, 64][i % 3];
    return c(`mixed ${DT[dtype]}/kv ${kv} ${layout} bs${block_size}`, {
      dtype,
      kv_cache_dtype: kv,
      layout,
      block_size,
      ...(fp8 ? { k_scale: 0.5 + (i % 3) * 0.25, v_scale: 1.25 } : {}),
    });
  });
}

/** Decode-only batches over the dtype/layout/feature space (for decode-only backends too). */
function decodeMatrix(): ConformanceCase[] {
  const d = (name: string, over: Partial<BatchSpec>) =>
    c(`decode ${name}`, { requests: R.decode(), ...over });
  const cross: RequestSpec[] = [{ query_len: 1, seq_len: 23 }, {
    query_len: 1,
    seq_len: 50,
    pad: 3,
  }];
  return [
    d("f32/kv float16 HND bs32", {
      dtype: "float32",
      kv_cache_dtype: "float16",
      layout: "HND",
      block_size: 32,
    }),
    d("f32/kv bfloat16 NHD bs64", { dtype: "float32", kv_cache_dtype: "bfloat16", block_size: 64 }),
    d("f16/kv fp8_e4m3 HND bs16 d128", {
      kv_cache_dtype: "fp8_e4m3",
      k_scale: 0.5,
      v_scale: 1.5,
      layout: "HND",
      head_size: 128,
    }),
    d("bf16/kv fp8_e5m2 NHD bs32 d128", {
      dtype: "bfloat16",
      kv_cache_dtype: "fp8_e5m2",
      k_scale: 1.25,
      v_scale: 0.75,
      block_size: 32,
      head_size: 128,
    }),
    d("bf16/kv auto HND bs64 d256", {
      dtype: "bfloat16",
      layout: "HND",
      block_size: 64,
      head_size: 256,
    }),
    d("f16 alibi +lse", { alibi: true, return_lse: true }),
    d("f16 non-causal", { causal: false }),
    d("f16 sinks+window+soft_cap +lse HND", {
      sinks: true,
      sliding_window: 9,
      logits_soft_cap: 1.5,
      q_std: 3,
      return_lse: true,
      layout: "HND",
    }),
    d("f16 padding (-1 slots, pure decode)", {
      requests: [{ query_len: 1, seq_len: 20, pad: 1 }, { query_len: 1, seq_len: 33 }, {
        query_len: 1,
        seq_len: 1,
        pad: 1,
      }],
    }),
    c("decode encoder_decoder f16 writing encoder K/V", {
      attn_type: "encoder_decoder",
      requests: cross,
    }),
    c("decode encoder_decoder bf16 HND no new K/V +lse", {
      attn_type: "encoder_decoder",
      dtype: "bfloat16",
      layout: "HND",
      cross_write: false,
      return_lse: true,
      requests: cross,
    }),
  ];
}

function shapeMatrix(): ConformanceCase[] {
  const out: ConformanceCase[] = [];
  for (const head_size of [64, 128, 256]) {
    for (const layout of ["NHD", "HND"] as const) {
      out.push(c(`decode f16 ${layout} bs16 d${head_size} gqa4`, {
        head_size,
        layout,
        requests: R.decode(),
      }));
    }
    out.push(c(`prefill f16 NHD bs32 d${head_size} gqa4`, {
      head_size,
      block_size: 32,
      requests: R.prefill(),
    }));
  }
  for (const block_size of [16, 32, 64]) {
    out.push(c(`chunked bf16 HND bs${block_size} d128`, {
      dtype: "bfloat16",
      layout: "HND",
      block_size,
      head_size: 128,
      requests: R.chunked(),
    }));
  }
  // GQA ratios 1, 4, 8 (and MQA-like 8 with one kv head pair).
  const gqa: [number, number][] = [[4, 4], [8, 2], [16, 2]];
  for (const [num_heads, num_kv_heads] of gqa) {
    const g = num_heads / num_kv_heads;
    out.push(c(`decode f16 gqa${g} (${num_heads}q/${num_kv_heads}kv) d128`, {
      num_heads,
      num_kv_heads,
      head_size: 128,
      requests: R.decode(),
    }));
    out.push(c(`mixed f32 gqa${g} (${num_heads}q/${num_kv_heads}kv) d64 HND`, {
      dtype: "float32",
      num_heads,
      num_kv_heads,
      layout: "HND",
    }));
  }
  out.push(c("decode f16 mqa (8q/1kv) d64 bs64", {
    num_heads: 8,
    num_kv_heads: 1,
    block_size: 64,
    requests: R.decode(),
  }));
  return out;
}

function featureCases(): ConformanceCase[] {
  const lse = { return_lse: true };
  return [
    c("mixed f16 +lse", lse),
    c("decode f32 +lse", { ...lse, dtype: "float32", requests: R.decode() }),
    c("mixed f16 sinks +lse", { ...lse, sinks: true }),
    c("decode bf16 sinks d128 HND", {
      dtype: "bfloat16",
      sinks: true,
      head_size: 128,
      layout: "HND",
      requests: R.decode(),
    }),
    c("mixed f16 sliding_window 8", { sliding_window: 8 }),
    c("decode f16 sliding_window 12 bs32", {
      sliding_window: 12,
      block_size: 32,
      requests: R.decode(),
    }),
    c("chunked f32 sliding_window 20 +lse", {
      ...lse,
      dtype: "float32",
      sliding_window: 20,
      requests: R.chunked(),
    }),
    c("mixed f16 soft_cap 1.5", { logits_soft_cap: 1.5, q_std: 3 }),
    c("decode f32 soft_cap 2 +lse", {
      ...lse,
      dtype: "float32",
      logits_soft_cap: 2,
      q_std: 3,
      requests: R.decode(),
    }),
    c("mixed f16 alibi", { alibi: true }),
    c("chunked f32 alibi +lse", { ...lse, dtype: "float32", alibi: true, requests: R.chunked() }),
    c("mixed f16 sinks+window+soft_cap", {
      sinks: true,
      sliding_window: 10,
      logits_soft_cap: 1.5,
      q_std: 3,
    }),
    c("mixed f32 scale 0.3", { dtype: "float32", scale: 0.3 }),
    c("prefill f16 non-causal decoder", { causal: false, requests: R.prefill() }),
    c("chunked f32 non-causal decoder +lse", {
      ...lse,
      dtype: "float32",
      causal: false,
      requests: R.chunked(),
    }),
    c("decode f16 padding (-1 slots) bs32", {
      block_size: 32,
      requests: [
        { query_len: 1, seq_len: 20, pad: 1 },
        { query_len: 1, seq_len: 33 },
        { query_len: 5, seq_len: 37, pad: 3 },
      ],
    }),
    c("mixed f16 with an idle request (query_len 0)", {
      requests: [
        { query_len: 1, seq_len: 20 },
        { query_len: 0, seq_len: 12 },
        { query_len: 9, seq_len: 9 },
      ],
    }),
    c("mixed f16 kv fp8_e4m3 k_scale 0.25 +lse", {
      ...lse,
      kv_cache_dtype: "fp8_e4m3",
      k_scale: 0.25,
      v_scale: 0.5,
    }),
  ];
}

function attnTypeCases(): ConformanceCase[] {
  const enc: RequestSpec[] = [{ query_len: 11, seq_len: 11 }, { query_len: 25, seq_len: 25 }];
  const cross: RequestSpec[] = [{ query_len: 3, seq_len: 19 }, {
    query_len: 1,
    seq_len: 40,
    pad: 2,
  }];
  return [
    c("encoder f16 d64", { attn_type: "encoder", requests: enc }),
    c("encoder f32 d128 +lse", {
      attn_type: "encoder",
      dtype: "float32",
      head_size: 128,
      return_lse: true,
      requests: enc,
    }),
    c("encoder_only bf16 d64 gqa1", {
      attn_type: "encoder_only",
      dtype: "bfloat16",
      num_heads: 4,
      num_kv_heads: 4,
      requests: enc,
    }),
    c("encoder_only f16 sinks", { attn_type: "encoder_only", sinks: true, requests: enc }),
    c("encoder_decoder f16 writing encoder K/V", { attn_type: "encoder_decoder", requests: cross }),
    c("encoder_decoder f32 HND bs32 no new K/V +lse", {
      attn_type: "encoder_decoder",
      dtype: "float32",
      layout: "HND",
      block_size: 32,
      cross_write: false,
      return_lse: true,
      requests: cross,
    }),
  ];
}

function longCases(big: boolean): ConformanceCase[] {
  const ctx = big ? 16384 : 4100;
  const out = [
    c(`long decode f16 2x~${ctx} d128 gqa4`, {
      head_size: 128,
      requests: [{ query_len: 1, seq_len: ctx }, { query_len: 1, seq_len: ctx + 397 }],
    }),
    c(`long chunked bf16 kv fp8_e4m3 HND 24 new @ ${ctx + 96} d128 +lse`, {
      dtype: "bfloat16",
      kv_cache_dtype: "fp8_e4m3",
      k_scale: 0.5,
      v_scale: 0.5,
      layout: "HND",
      head_size: 128,
      return_lse: true,
      requests: [{ query_len: 24, seq_len: ctx + 96 }],
    }),
  ];
  if (big) {
    out.push(
      c("big decode f16 32x2048 32q/8kv d128", {
        num_heads: 32,
        num_kv_heads: 8,
        head_size: 128,
        requests: Array.from({ length: 32 }, (_, i) => ({ query_len: 1, seq_len: 2048 - 13 * i })),
      }),
      c("big prefill f16 2x512 causal 32q/8kv d128", {
        num_heads: 32,
        num_kv_heads: 8,
        head_size: 128,
        requests: [{ query_len: 512, seq_len: 512 }, { query_len: 509, seq_len: 509 }],
      }),
      c("big mixed bf16 d256 bs64", {
        dtype: "bfloat16",
        head_size: 256,
        block_size: 64,
        requests: [
          ...Array.from({ length: 16 }, (_, i) => ({ query_len: 1, seq_len: 700 + 31 * i })),
          { query_len: 200, seq_len: 900, pad: 5 },
          { query_len: 300, seq_len: 300 },
        ],
      }),
    );
  }
  return out;
}

/** Every case; `scale` "big" (CONFORMANCE_SCALE=big) enlarges the long ones and adds more. */
export function conformanceCases(scale: "small" | "big" = "small"): ConformanceCase[] {
  return [
    ...dtypeMatrix(),
    ...decodeMatrix(),
    ...shapeMatrix(),
    ...featureCases(),
    ...attnTypeCases(),
    ...longCases(scale === "big"),
  ];
}
