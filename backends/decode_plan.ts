/**
 * Planning split-KV decoding for the rows of a batch (WEBGPU_DECODE runs every row this way;
 * WEBGPU_FLASH its decode rows): {@link planDecodeRows} turns each query token of the chosen
 * requests into work items (slices of the keys that token may see), picks the kernel shape,
 * the slice length (backends/decode_split_policy.ts) and how the split kernel ends (rows of
 * one slice written directly, the reduce fused or a reduce pass: backends/decode_shape.ts
 * epilogueMode), compiles the kernels (cached per device), and adds their Params and the item /
 * block-table / slope / row / sink table to the plan table. A query token at position p sees keys
 * [max(0, p - w + 1), p + 1) under a causal mask (window w), so each token is its own decode
 * row: a request of query length n > 1 is n rows.
 * The layout (slices, epilogue, item order and counts: backends/decode_plan_layout.ts), what it
 * puts in the table and compiles (backends/decode_plan_table.ts), what it adds to a plan
 * (backends/decode_rows_plan.ts) and the partials' sizes (backends/decode_partials.ts) live in
 * their own modules; the last two are re-exported here.
 * @module
 */
import type { BatchShape, GpuContext } from "../core/types.ts";
import { DECODE_REDUCE, DECODE_SPLIT } from "../gpu/decode_kernels.ts";
import type { BindRef, PlannedCall } from "../gpu/gpu_plan.ts";
import { type CompiledKernel, compiledKernel, getKernel } from "../gpu/kernel.ts";
import type { Section, TableBuilder } from "../gpu/plan_table.ts";
import { elementsPerWord } from "../gpu/wgsl.ts";
import { decodeRowRanges } from "./decode_rows.ts";
import { RESIDENCY_BUFFER, RESIDENCY_INFO } from "../gpu/decode_residency.ts";
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";
import type { DecodeRowsPlan } from "./decode_rows_plan.ts";
import { type DecodeLayout, layoutDecodeRows } from "./decode_plan_layout.ts";
import { splitConsts, splitParams, tableWriter } from "./decode_plan_table.ts";

export { FUSED_PART_BYTES, partialBytes, partialLimit } from "./decode_partials.ts";
export type { DecodeRowsPlan } from "./decode_rows_plan.ts";

/**
 * Plans the decode rows of `s`: every query token of the requests `reqs` selects. The cache
 * spec must be set (decoder or encoder_decoder). `pass` names the passes (`decode_split`,
 * `decode_reduce`; `prefill_*` for WEBGPU_FLASH's prefill rows in their own dispatch, so device
 * timings tell the two apart).
 */
export async function planDecodeRows(
  ctx: GpuContext,
  tuning: DecodeTuning,
  s: BatchShape,
  reqs: (i: number) => boolean,
  table: TableBuilder,
  pass: "decode" | "prefill" = "decode",
): Promise<DecodeRowsPlan | null> {
  const rows = decodeRowRanges(s, reqs);
  if (rows.count === 0) return null;
  const l = layoutDecodeRows(ctx, tuning, s, rows);
  const consts = splitConsts(tuning, s, l);
  const params = table.add(splitParams(s, l));
  const tabSec = table.addWords(l.sinkOff + s.layer.num_heads, tableWriter(s, l));
  // Sections are added before the first await: the table's layout then follows the order the
  // planners were called in, whatever order the kernels resolve in (stable bindings).
  const reduce = l.epi < 2 && l.numRows > 0;
  // Compiled already (every step after the first): no await.
  const reduceConsts = { d: s.layer.head_size, dtype: s.dtype };
  let split_k = compiledKernel(ctx, DECODE_SPLIT, consts);
  let reduce_k = reduce ? compiledKernel(ctx, DECODE_REDUCE, reduceConsts) : null;
  if (!split_k || (reduce && !reduce_k)) {
    [split_k, reduce_k] = await Promise.all([
      getKernel(ctx, DECODE_SPLIT, consts),
      reduce ? getKernel(ctx, DECODE_REDUCE, reduceConsts) : null,
    ]);
  }
  const calls = plannedCalls(pass, tuning, l, split_k, reduce_k, params, tabSec);
  return rowsPlan(tuning, s, l, calls, split_k, reduce_k);
}

/**
 * The split pass (its epilogue's outputs and the residency counters bound where used) and, with
 * `reduce_k`, the reduce pass. Their partials and counters: pooled scratch, or under the fused
 * reduce the device's own zeroed buffer (wgsl/decode_fused.wgsl: every word zero between its
 * dispatches).
 */
function plannedCalls(
  pass: "decode" | "prefill",
  tuning: DecodeTuning,
  l: DecodeLayout,
  split_k: CompiledKernel,
  reduce_k: CompiledKernel | null,
  params: Section,
  tabSec: Section,
): PlannedCall[] {
  const epi = l.epi;
  const part: BindRef = epi === 2
    ? { persistent: "decode_fused_part", bytes: l.partBytes }
    : { scratch: "part" };
  const calls: PlannedCall[] = [{
    name: `${pass}_split`,
    kernel: split_k,
    bind: {
      P: { table: params },
      q: { io: "query" },
      tab: { table: tabSec },
      part,
      ...(epi > 0 ? { out: { io: "out" }, lse: { io: "lse" } } : {}),
      ...(tuning.probe_residency ? { res: { persistent: RESIDENCY_BUFFER, bytes: 16 } } : {}),
    },
    cache: true,
    grid: l.splitGrid,
  }];
  if (reduce_k) {
    calls.push({
      name: `${pass}_reduce`,
      kernel: reduce_k,
      bind: {
        P: { table: params },
        tab: { table: tabSec },
        part: { scratch: "part" },
        out: { io: "out" },
        lse: { io: "lse" },
      },
      grid: l.reduceGrid,
    });
  }
  return calls;
}

/** What the plan of the layout `l` adds: `calls`, the partials' bytes, the counts and the
 * launch geometry. */
function rowsPlan(
  tuning: DecodeTuning,
  s: BatchShape,
  l: DecodeLayout,
  calls: PlannedCall[],
  split_k: CompiledKernel,
  reduce_k: CompiledKernel | null,
): DecodeRowsPlan {
  const shape = l.shape, nkg = shape.wg / shape.lpk, perItem = l.perItem;
  return {
    calls,
    part_bytes: Math.max(16, l.epi === 2 ? 16 : l.partBytes),
    rows: l.rows.count,
    items: l.items,
    split_keys: l.split,
    split_rows: l.numRows,
    epilogue: l.epi,
    table_entries: l.tb,
    staged_kv: shape.skv,
    geometry: {
      decode_workgroups: l.groups * perItem,
      decode_reduce_workgroups: reduce_k ? l.numRows * s.layer.num_heads : 0,
      decode_steps: Math.ceil(l.split / ((nkg / shape.wh / l.wt) * shape.u)),
      decode_waves_x1000: Math.round(
        (1000 * l.groups * perItem) / shape.wave,
      ),
      decode_wg_invocations: shape.wg,
      decode_wg_kv_heads: shape.wh,
      decode_wg_tokens: l.wt,
      decode_longest_first: l.reordered ? 1 : 0,
      [RESIDENCY_INFO]: tuning.probe_residency ? 1 : 0,
    },
    key: split_k.key,
  };
}

/** Elements per u32 word of the cache's storage (re-exported for the descriptor). */
export { elementsPerWord };
