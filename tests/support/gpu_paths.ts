/**
 * The GPU kernel paths a numeric regression test runs a batch through, by name: WEBGPU_DECODE
 * with its defaults, one slice a row (no reduce), and the transposed sums and softmax; the
 * registered WEBGPU_FLASH's defaults (split-KV rows, or the tensor cores where granted) and its
 * portable tiles (ATTN_PREFILL_SPLIT=0's path).
 * @module
 */
import { makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import { makeWebGpuFlash } from "../../backends/webgpu_flash.ts";
import { type DecodeTuning, DEFAULT_DECODE_TUNING } from "../../backends/webgpu_decode_tuning.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { ONE_SLICE_TUNING } from "./decode_knob_specs.ts";

/** A path's name. */
export type GpuPath =
  | "WEBGPU_DECODE"
  | "WEBGPU_DECODE, one slice a row"
  | "WEBGPU_DECODE, transposed sums and softmax"
  | "WEBGPU_FLASH"
  | "WEBGPU_FLASH, portable tiles";

const decode = (t: Partial<DecodeTuning>) =>
  makeWebGpuDecode({ ...DEFAULT_DECODE_TUNING, ...t }) as AttentionBackend;
const flash = (prefill_split?: boolean) =>
  makeWebGpuFlash({ tile: null, decode: DEFAULT_DECODE_TUNING, prefill_split }) as AttentionBackend;

/** Each path's name and backend. */
export const GPU_PATHS: Record<GpuPath, AttentionBackend> = {
  "WEBGPU_DECODE": decode({}),
  "WEBGPU_DECODE, one slice a row": decode(ONE_SLICE_TUNING),
  "WEBGPU_DECODE, transposed sums and softmax": decode({
    scatter_sums: true,
    scatter_softmax: true,
  }),
  "WEBGPU_FLASH": flash(),
  "WEBGPU_FLASH, portable tiles": flash(false),
};

/** The named paths, as [name, backend] pairs in the order given. */
export const gpuPaths = (...names: GpuPath[]): [string, AttentionBackend][] =>
  names.map((n) => [n, GPU_PATHS[n]]);
