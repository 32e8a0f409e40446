/**
 * ALiBi on cross-attention (`encoder_decoder`) where a request has more query tokens than
 * encoder keys: its first queries sit at negative positions (p = seq_len - query_len + j, the
 * reference's semantics), and the bias -slope (p - k) is then positive. The split-KV kernels kept
 * the position as a u32, so such a row got a bias near 2^32 x slope (LSE about -2.1e9, outputs off
 * by up to 1.95 on WEBGPU_DECODE and WEBGPU_FLASH's decode rows; a black-box audit of v0.23's
 * main). Checked against CPU_REFERENCE: output, LSE and the cache after the call.
 * @module
 */
import { type BatchSpec, smallSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { gpuPaths } from "../support/gpu_paths.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

/** Requests with more queries than encoder keys (2 of 3), one with fewer. */
const CROSS: BatchSpec = smallSpec({
  dtype: "float32",
  attn_type: "encoder_decoder",
  requests: [{ query_len: 6, seq_len: 2 }, { query_len: 1, seq_len: 9 }, {
    query_len: 20,
    seq_len: 17,
  }],
  alibi: true,
});

const BACKENDS = gpuPaths(
  "WEBGPU_DECODE",
  "WEBGPU_DECODE, one slice a row",
  "WEBGPU_DECODE, transposed sums and softmax",
  "WEBGPU_FLASH",
);

for (const [name, b] of BACKENDS) {
  for (const dtype of ["float32", "float16"] as const) {
    Deno.test(`cross-attention ALiBi at negative query positions: ${name}, ${dtype}`, {
      ignore: NO_GPU,
    }, async () => {
      await checkBackend(b, GPU!, { ...CROSS, dtype });
    });
  }
}
