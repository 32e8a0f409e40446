/**
 * The split-KV kernels' tuning for prefill rows (WEBGPU_FLASH's rows longer than one token on
 * those kernels): {@link prefillSplitTuning} over the decode tuning, and the measured values it
 * takes on GPU adapters.
 * @module
 */
import type { LayerSpec } from "../core/types.ts";
import { headTile } from "./decode_shape.ts";
import { type DecodeTuning, DEFAULT_DECODE_TUNING } from "./webgpu_decode_tuning.ts";

/**
 * The tuning of a plan whose split-KV kernels take prefill rows too (WEBGPU_FLASH where the
 * tensor-core kernel does not: Deno's runtime, software adapters), `t` with the transposed
 * partial sums and the softmax on them, and {@link PREFILL_WG_TOKENS} tokens a workgroup. A
 * prefill token reads its whole prefix from cache lines other tokens also read, so those rows
 * look bound by the lanes' arithmetic and shuffles rather than by memory (a reading of the
 * sweep, not a profile): on an H100 under Deno's runtime (bench/NOTES.md v0.19) the transposed
 * sums took 4 x 1024 causal 2.12 -> 1.97 ms and 8 x 4096 56.0 -> 51.0 ms (0.27x -> 0.29x and
 * 0.32x -> 0.35x the FMA ceiling); the other knobs tried there (fewer lanes a key row, 8 keys a
 * step, 256 invocations) were slower then, but with the transposed softmax and 4 tokens a
 * workgroup 8 keys a step gain ({@link PREFILL_GPU_KEYS_PER_ITER}), and on GPU adapters
 * {@link PREFILL_GPU_TUNING}'s fields gain more (`software`: a software adapter's plan keeps
 * them). Decode steps keep `t` (bandwidth-bound; the H200's sweeps gained nothing from these
 * knobs).
 */
export function prefillSplitTuning(
  t: Readonly<DecodeTuning>,
  software: boolean,
  layer?: Pick<LayerSpec, "num_heads" | "num_kv_heads" | "head_size">,
): DecodeTuning {
  const out: DecodeTuning = {
    ...t,
    scatter_sums: true,
    scatter_softmax: true,
    wg_tokens: t.wg_tokens > 1 ? t.wg_tokens : PREFILL_WG_TOKENS,
    gpu_keys_per_iter: t.gpu_keys_per_iter || PREFILL_GPU_KEYS_PER_ITER,
  };
  if (software || !t.prefill_gpu_tuning) return out;
  const gpu: Partial<DecodeTuning> = { ...PREFILL_GPU_TUNING };
  if (layer && !fewLanesFit(t, layer)) {
    const tile = fewLanesTile(t, layer);
    if (tile > 0) gpu.max_heads = tile;
    else {
      delete gpu.workgroup_size;
      delete gpu.max_lanes;
    }
  }
  const fields = out as unknown as Record<string, unknown>;
  const defaults = DEFAULT_DECODE_TUNING as unknown as Record<string, unknown>;
  for (const [k, v] of Object.entries(gpu)) {
    if (fields[k] === defaults[k]) fields[k] = v;
  }
  return out;
}

/**
 * Elements of the query heads a key group keeps, over a lane, that {@link PREFILL_GPU_TUNING}'s 8
 * lanes a key row were measured at (4 heads of 128 over 8 lanes: each lane holds 64 query and 64
 * accumulator values). Fewer lanes hold more a lane; at twice this (the bench's 4 lanes a row)
 * prefill ran 5x slower, as a register spill would.
 */
export const PREFILL_LANE_ELEMENTS = 64;

/** Whether 8 lanes a key row keep `layer`'s lane state within {@link PREFILL_LANE_ELEMENTS}. */
function fewLanesFit(
  t: Readonly<DecodeTuning>,
  layer: Pick<LayerSpec, "num_heads" | "num_kv_heads" | "head_size">,
): boolean {
  const heads = headTile(layer.num_heads / layer.num_kv_heads, t.max_heads);
  return (heads * layer.head_size) / PREFILL_GPU_TUNING.max_lanes! <= PREFILL_LANE_ELEMENTS;
}

/**
 * The heads a workgroup that tile `layer`'s GQA group so 8 lanes a key row keep the measured
 * state ({@link PREFILL_LANE_ELEMENTS} a lane), or 0 where no tiling was measured to pay: only
 * with `max_heads` and `max_lanes` at their defaults, a tile of at least 4 heads (each decoded
 * element still feeds 4, as in every measured fast shape) and a group it divides (a group of 7
 * would fall to tiles of one head, reading K/V seven times). So a group of 8 or 16 at head size
 * 128 takes tiles of 4; groups of 5-7 and 12 at 128, and head sizes over 128, keep the untiled
 * shape.
 */
function fewLanesTile(
  t: Readonly<DecodeTuning>,
  layer: Pick<LayerSpec, "num_heads" | "num_kv_heads" | "head_size">,
): number {
  const d = DEFAULT_DECODE_TUNING;
  if (t.max_heads !== d.max_heads || t.max_lanes !== d.max_lanes) return 0;
  const group = layer.num_heads / layer.num_kv_heads;
  const most = Math.floor(
    (PREFILL_LANE_ELEMENTS * PREFILL_GPU_TUNING.max_lanes!) / layer.head_size,
  );
  return most >= 4 && group % most === 0 ? most : 0;
}

/**
 * The prefill rows' values on GPU adapters of the fields a tuning leaves at their defaults (a
 * field `ATTN_DECODE_TUNING` sets to anything else is kept): 64 invocations a workgroup, 8 lanes
 * a key row (with 4 tokens a workgroup, 8 key groups: two runs of each token's keys), the
 * all-gather by indexed shuffles, and each request's longest rows first. On an H100 under
 * Deno's runtime (bench/NOTES.md v0.26, calls 2-4), on top of the transposed sums, 4 tokens and
 * 8 keys a step: 4 x 1024 causal 1.58 -> 1.45-1.46 ms (0.356x -> 0.388x the FMA ceiling), 8 x
 * 4096 45.7 -> 40.8 ms (0.395x -> 0.443x). Each alone gained less or lost: 8 lanes at 128
 * invocations 1.72 / 44.5, 64 invocations at 16 lanes 1.65 / 48.4, the indexed gather at 128 x 16
 * 1.55 / 45.3, longest first 1.55 / 45.6 (and 1.55 / 41.2 -> 1.46 / 40.8 on top of the other
 * three). The 64 invocations and 8 lanes go together, and only to layers whose lane state stays
 * within {@link PREFILL_LANE_ELEMENTS}, or does once the GQA group is tiled where that was
 * measured to pay (fewLanesTile: a group of 8 at head size 128 in tiles of 4 heads, twice the
 * workgroups; on an H100 under Deno's runtime, 64 q / 8 kv heads, as WEBGPU_DECODE variants with
 * these fields, bench/NOTES.md v0.27: 4 x 1024 causal 2.92 -> 2.82 ms (0.387x -> 0.401x the FMA
 * ceiling), 8 x 4096 83.2 -> 80.3 ms (0.434x -> 0.450x) against the untiled 128 invocations and 16
 * lanes, and 6.58 / 190 ms with all 8 heads at 8 lanes: 128 elements a lane spill). Other layers
 * keep the untiled shape (128 invocations, the lanes their rows allow). Software adapters keep the
 * fields as they are (lavapipe's 2 x 256 moved within its noise); `prefill_gpu_tuning: false`
 * keeps them on GPUs too.
 */
export const PREFILL_GPU_TUNING: Readonly<Partial<DecodeTuning>> = Object.freeze({
  workgroup_size: 64,
  max_lanes: 8,
  indexed_gather: true,
  longest_first: true,
});

/**
 * Keys a step of a prefill row on GPU adapters where the tuning leaves `keys_per_iter` 0: on an
 * H100 under Deno's runtime, with the transposed sums and 4 tokens a workgroup, 8 keys took 4 x
 * 1024 causal 1.65 -> 1.59 ms (0.343x -> 0.356x the FMA ceiling) and 8 x 4096 47.9 -> 45.7 ms
 * (0.377x -> 0.395x), twice each (bench/NOTES.md v0.25); 16 was slower (1.83 / 50.8). On
 * lavapipe 8 was slower than its 1 (2 x 256: 39 -> 48-116 ms), so software adapters keep 1.
 */
export const PREFILL_GPU_KEYS_PER_ITER = 8;

/**
 * The tokens a workgroup of prefill rows spans on the split-KV kernels unless the tuning names
 * more (`wg_tokens`): on an H100 under Deno's runtime 4 x 1024 causal 1.97 -> 1.75 ms (0.287x ->
 * 0.322x the FMA ceiling), 8 x 4096 51.3 -> 50.7 ms; 2 gave 1.82 / 51.8, 8 was slower (2.38 /
 * 68.7): bench/NOTES.md v0.22. Taken only where the plan's rows allow (backends/decode_rows.ts
 * tokenGroups: a decode row beside prefill chunks keeps 1).
 */
export const PREFILL_WG_TOKENS = 4;
