/**
 * A large logits soft cap (`cap * tanh(s / cap)`, nearly the identity) within float32's tolerance
 * of float64 on every GPU path. The kernels took WGSL's `tanh`, accurate near 0 only in absolute
 * terms on lavapipe (and the spec lets any device be), which the multiply by the cap magnified: at a
 * cap of 1e4 outputs were off by 6e-4 and the LSE by 4e-4, at 1e5 by 4e-3 / 5e-3, against f32's
 * 1e-4 (a numerics audit). They now take gpu/wgsl.ts `tanh_rel` (the odd series near 0). A cap of
 * 30 (what models use) and 0.5 (past tanh's knee) are checked beside.
 * @module
 */
import { type BatchSpec, smallSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { gpuPaths } from "../support/gpu_paths.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

const SPEC: BatchSpec = smallSpec({
  dtype: "float32",
  requests: [{ query_len: 1, seq_len: 40 }, { query_len: 8, seq_len: 20 }],
  q_std: 3,
});

const BACKENDS = gpuPaths(
  "WEBGPU_DECODE",
  "WEBGPU_DECODE, transposed sums and softmax",
  "WEBGPU_FLASH",
  "WEBGPU_FLASH, portable tiles",
);

for (const [name, b] of BACKENDS) {
  for (const cap of [1e5, 1e4, 30, 0.5]) {
    Deno.test(`soft cap ${cap}: ${name} within f32's tolerance of float64`, {
      ignore: NO_GPU,
    }, async () => {
      await checkBackend(b, GPU!, { ...SPEC, logits_soft_cap: cap });
    });
  }
}
