/**
 * What the decode-row planner (backends/decode_plan.ts planDecodeRows) adds to a plan
 * ({@link DecodeRowsPlan}): the planned calls, the partials' bytes, the row, item and slice
 * counts, how the split kernel ends, and the plan-info counts of the launch geometry.
 * @module
 */
import type { PlannedCall } from "../gpu/gpu_plan.ts";

/** What {@link planDecodeRows} adds to a plan. */
export interface DecodeRowsPlan {
  calls: PlannedCall[];
  /** Bytes of the partials scratch buffer. */
  part_bytes: number;
  /** Query tokens handled (rows) and work items (slices). */
  rows: number;
  items: number;
  split_keys: number;
  /** Rows cut into several slices (the rest write their output from the split pass when
   * `epilogue` > 0). */
  split_rows: number;
  /** How the split kernel ends (gpu/decode_kernels.ts `epi`) and its staged block-table
   * entries (0: none). */
  epilogue: number;
  table_entries: number;
  /** vec4<u32>s of the staged K + V tile (`stage_kv`; 0: plain loads). */
  staged_kv: number;
  /** Plan-info counts of the launch geometry: split and reduce workgroups, key-group steps of
   * a full slice, waves of `wave_workgroups` the split grid makes (x 1000), and 1 under
   * `probe_residency` (RESIDENCY_INFO). */
  geometry: Record<string, number>;
  key: string;
}
