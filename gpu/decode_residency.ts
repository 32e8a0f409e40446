/**
 * The split kernel's residency probe (tuning `probe_residency`; for the bench, off by default):
 * invocation 0 of every split workgroup counts itself in when it starts and out when it ends,
 * in three atomic counters of the device's buffer {@link RESIDENCY_BUFFER}: [0] workgroups
 * running now, [1] the most that ran at once, [2] workgroups that ran. WebGPU reports no SM
 * count nor occupancy; [1] over a grid larger than the device holds is the wave the `waves`
 * slice policy assumes (`wave_workgroups`; on GPUs 528 = 132 SMs x 4 on an H200 by guess), and
 * over the bench's own grid it says whether that grid ran in one wave. Two atomics a workgroup:
 * the kernel's timing is otherwise unchanged (its registers may differ by a few).
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { persistentBuffer } from "./persistent_buffers.ts";

/** The device buffer of the counters (gpu/persistent_buffers.ts). */
export const RESIDENCY_BUFFER = "decode_residency";
/** The plan info field that is 1 when the plan's split kernel carries the probe. */
export const RESIDENCY_INFO = "decode_probe";
const BYTES = 16;

/** The counters' buffer on `ctx`'s device. */
export const residencyBuffer = (ctx: GpuContext): GPUBuffer =>
  persistentBuffer(ctx, RESIDENCY_BUFFER, BYTES);

/** A launch's upload that zeroes the counters (before its dispatches). */
export const residencyUploads = (ctx: GpuContext) => [
  { buffer: residencyBuffer(ctx), data: new Uint8Array(BYTES) },
];

/** A launch's read of the counters (after its dispatches). */
export const residencyReads = (ctx: GpuContext) => [
  { buffer: residencyBuffer(ctx), bytes: BYTES },
];

/** WGSL at the workgroup's start (after its early return) and at its end; `res` is bound. */
export const PROBE_ENTER = [
  "  if (lid == 0u) {",
  "    atomicMax(&res[1], atomicAdd(&res[0], 1u) + 1u);",
  "    atomicAdd(&res[2], 1u);",
  "  }",
].join("\n");
export const PROBE_LEAVE = "  if (lid == 0u) {\n    atomicSub(&res[0], 1u);\n  }";
