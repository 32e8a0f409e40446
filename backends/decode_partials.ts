/**
 * The partial results of the split-KV decode kernel (backends/decode_plan.ts plans them): their
 * bytes per item ({@link partialBytes}), the most one buffer may hold on a device
 * ({@link partialLimit}), and the most the fused reduce keeps in its device-owned buffer
 * ({@link FUSED_PART_BYTES}).
 * @module
 */
import type { GpuContext } from "../core/types.ts";

/** Most bytes of partials the fused reduce keeps in its device-owned buffer (beyond: epi 1). */
export const FUSED_PART_BYTES = 64 * 2 ** 20;

/** Bytes of the split pass's partial results: acc[D] and (m, l, 0, 0) per item and head. */
export const partialBytes = (items: number, heads: number, headSize: number): number =>
  items * heads * (headSize + 4) * 4;

/** The most bytes one partial-results buffer may have on `ctx` (one binding, one buffer). */
export function partialLimit(ctx: GpuContext): number {
  return Math.min(
    ctx.limits.maxStorageBufferBindingSize ?? 2 ** 27,
    ctx.limits.maxBufferSize ?? 2 ** 28,
  );
}
