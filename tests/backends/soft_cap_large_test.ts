/**
 * A large logits soft cap (`cap * tanh(s / cap)`, nearly the identity) within float32's tolerance
 * of float64 on every GPU path. The kernels took WGSL's `tanh`, accurate near 0 only in absolute
 * terms on lavapipe (and the spec lets any device be), which the multiply by the cap magnified: at a
 * cap of 1e4 outputs were off by 6e-4 and the LSE by 4e-4, at 1e5 by 4e-3 / 5e-3, against f32's
 * 1e-4 (a numerics audit). They now take gpu/wgsl.ts `tanh_rel` (the odd series near 0). A cap of
 * 30 (what models use) and 0.5 (past tanh's knee) are checked beside.
 * @module
 */
import { makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import { makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import { DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import type { AttentionBackend } from "../../core/types.ts";
import type { BatchSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

const SPEC: BatchSpec = {
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 16,
  head_size: 64,
  num_heads: 4,
  num_kv_heads: 2,
  requests: [{ query_len: 1, seq_len: 40 }, { query_len: 8, seq_len: 20 }],
  q_std: 3,
  return_lse: true,
};

const BACKENDS: [string, AttentionBackend][] = [
  ["WEBGPU_DECODE", makeWebGpuDecode(DEFAULT_DECODE_TUNING) as AttentionBackend],
  [
    "WEBGPU_DECODE, transposed softmax",
    makeWebGpuDecode({
      ...DEFAULT_DECODE_TUNING,
      scatter_sums: true,
      scatter_softmax: true,
    }) as AttentionBackend,
  ],
  [
    "WEBGPU_FLASH",
    makeWebGpuFlash({ tile: null, decode: DEFAULT_DECODE_TUNING }) as AttentionBackend,
  ],
  [
    "WEBGPU_FLASH, portable tiles",
    makeWebGpuFlash({
      tile: null,
      decode: DEFAULT_DECODE_TUNING,
      prefill_split: false,
    }) as AttentionBackend,
  ],
];

for (const [name, b] of BACKENDS) {
  for (const cap of [1e5, 1e4, 30, 0.5]) {
    Deno.test(`soft cap ${cap}: ${name} within f32's tolerance of float64`, {
      ignore: NO_GPU,
    }, async () => {
      await checkBackend(b, GPU!, { ...SPEC, logits_soft_cap: cap });
    });
  }
}
