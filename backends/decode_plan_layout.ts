/**
 * The layout of a decode-row plan (backends/decode_plan.ts planDecodeRows):
 * {@link layoutDecodeRows} cuts each row's visible keys into slices, picks the slice length
 * (backends/decode_split_policy.ts) and how the split kernel ends (backends/decode_shape.ts
 * epilogueMode), orders the work items, counts them, and places the parts of the item table.
 * The table writer, the kernel constants and the Params uniforms (backends/decode_plan_table.ts)
 * and the planned calls read it.
 * @module
 */
import type { BatchShape, GpuContext } from "../core/types.ts";
import { dispatchSize } from "../gpu/batch_buffers.ts";
import { type KvChunkGeometry, kvChunkGeometry } from "../gpu/kv_cache.ts";
import { type DecodeShape, decodeShape, epilogueMode, stagedEntries } from "./decode_shape.ts";
import { sliceLength } from "./decode_split_policy.ts";
import { longestFirst, type RowRanges, severalRows, tokenGroups } from "./decode_rows.ts";
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";
import { FUSED_PART_BYTES, partialBytes, partialLimit } from "./decode_partials.ts";

/**
 * A decode-row plan's layout, worked out once per plan by {@link layoutDecodeRows} (its steps
 * fill it in order; nothing changes it afterwards).
 */
export interface DecodeLayout {
  /** The rows planned: one a query token. */
  rows: RowRanges;
  /** The cache's chunk geometry and the kernel shape. */
  g: KvChunkGeometry;
  shape: DecodeShape;
  /** Work items of one slice: one a (kv head block, head tile). */
  perItem: number;
  /** Each row's first slice start (a multiple of the shape's U) and its keys from there. */
  starts: number[];
  spans: number[];
  /** Keys a slice. */
  split: number;
  /** How the split kernel ends (gpu/decode_kernels.ts `epi`). */
  epi: number;
  /** Token items a workgroup spans (`wg_tokens`; 1 unless the rows are in token groups). */
  wt: number;
  /** The rows in item order (null: as they came), their count, and whether `longest_first`
   * moved any. */
  order: number[] | null;
  itemRows: number;
  reordered: boolean;
  /** Items (slices), rows with partials (cut into several slices, or every row under epi 0),
   * their partial slots, and the most blocks an item spans (`stage_table` only, else 1). */
  items: number;
  numRows: number;
  slots: number;
  most: number;
  /** Split workgroups per (kv head block, head tile). */
  groups: number;
  /** Word offsets in the item table of the block table, the slopes, the row table and the
   * sinks (the table ends at `sinkOff` + num_heads). */
  btOff: number;
  slopeOff: number;
  tokOff: number;
  sinkOff: number;
  /** Block-table entries a split workgroup stages (0: none). */
  tb: number;
  /** Bytes of the partials (and, under the fused reduce, its counters). */
  partBytes: number;
  /** The split and the reduce pass's dispatch grids. */
  splitGrid: readonly [number, number];
  reduceGrid: readonly [number, number];
}

/** The grids of a layout before {@link placeTable} sets them. */
const NO_GRID: readonly [number, number] = [0, 0];

/** The layout of the decode rows `rows` of `s` (the cache spec must be set). */
export function layoutDecodeRows(
  ctx: GpuContext,
  tuning: DecodeTuning,
  s: BatchShape,
  rows: RowRanges,
): DecodeLayout {
  const L = s.layer, spec = s.cache_spec!;
  const g = kvChunkGeometry(ctx, spec);
  const shape = decodeShape(ctx, tuning, L, spec, g.storage_dtype);
  const l: DecodeLayout = {
    rows,
    g,
    shape,
    perItem: (L.num_kv_heads / shape.kh / shape.wh) * shape.tiles,
    starts: [],
    spans: [],
    split: 0,
    epi: 0,
    wt: 1,
    order: null,
    itemRows: 0,
    reordered: false,
    items: 0,
    numRows: 0,
    slots: 0,
    most: 1,
    groups: 0,
    btOff: 0,
    slopeOff: 0,
    tokOff: 0,
    sinkOff: 0,
    tb: 0,
    partBytes: 0,
    splitGrid: NO_GRID,
    reduceGrid: NO_GRID,
  };
  sliceRows(l);
  chooseSplit(ctx, tuning, l, L.num_heads, L.head_size);
  orderItems(tuning, l);
  countItems(tuning, l, spec.block_size);
  placeTable(ctx, tuning, s, l);
  return l;
}

/**
 * Sets each row's first slice start and span: slices start at multiples of U (a step's keys
 * then share a block); the first one masks the keys before the row's true begin.
 */
function sliceRows(l: DecodeLayout): void {
  const { rows, starts, spans } = l, u = l.shape.u;
  for (let r = 0; r < rows.count; r++) {
    const b = rows.begin[r], e = rows.end[r];
    starts.push(e > b ? b - (b % u) : b);
    spans.push(e - starts[r]);
  }
}

/**
 * Sets the slice length and the epilogue: the split policy's length, doubled while the
 * partials of `H` heads of size `D` are over what one buffer may hold; the fused reduce takes
 * the reduce pass where its partials are big, and `direct_single` the plain kernel where every
 * row is cut.
 */
function chooseSplit(
  ctx: GpuContext,
  tuning: DecodeTuning,
  l: DecodeLayout,
  H: number,
  D: number,
): void {
  const shape = l.shape, spans = l.spans;
  let split = sliceLength(tuning, {
    spans,
    perItem: l.perItem,
    step: (shape.wg / shape.lpk) * shape.u,
    target: shape.target,
    wave: shape.wave,
    weight: shape.wh,
  });
  let epi = epilogueMode(ctx, tuning, shape, l.g.nchunk);
  const partLimit = partialLimit(ctx);
  while (partialBytes(partialSlots(spans, split, epi), H, D) > partLimit && split < 2 ** 30) {
    split *= 2;
  }
  // The fused reduce's partials stay allocated on the device: big ones take the reduce pass.
  if (epi === 2 && partialBytes(partialSlots(spans, split, epi), H, D) > FUSED_PART_BYTES) epi = 1;
  // direct_single changes nothing when every row is cut: keep the plain kernel then.
  if (epi === 1 && spans.every((sp) => sp > split)) epi = 0;
  l.split = split;
  l.epi = epi;
}

/** Partial slots of rows of `spans` cut into slices of `x` keys: every item (epi 0), else the
 * items of rows cut into several. */
function partialSlots(spans: readonly number[], x: number, epi: number): number {
  let n = 0;
  for (let r = 0; r < spans.length; r++) {
    const c = Math.max(1, Math.ceil(spans[r] / x));
    n += epi > 0 && c === 1 ? 0 : c;
  }
  return n;
}

/**
 * Sets the items' order: the token groups' rows (`wg_tokens`), taken only where every row is
 * one slice written by its epilogue, else the rows as they came; under `longest_first` each
 * request's groups from the longest to the shortest.
 */
function orderItems(tuning: DecodeTuning, l: DecodeLayout): void {
  const { rows, spans, split, shape } = l;
  const grouped = l.epi > 0 && spans.every((sp) => sp <= split)
    ? tokenGroups(rows, shape.wt)
    : null;
  const wt = grouped ? shape.wt : 1;
  const order = tuning.longest_first && severalRows(rows)
    ? longestFirst(grouped ?? spans.map((_, r) => r), wt, rows.req, spans)
    : grouped;
  l.wt = wt;
  l.order = order;
  l.itemRows = order?.length ?? rows.count;
  l.reordered = order !== grouped && order!.some((r, x) => r !== (grouped ? grouped[x] : x));
}

/**
 * Sets the item and row counts, the partial slots and the most blocks an item spans (cache
 * blocks of `bs` keys), in item order: the table is written in place when the plan's bytes
 * are made, so its size is known first.
 */
function countItems(tuning: DecodeTuning, l: DecodeLayout, bs: number): void {
  const { rows, starts, spans, split, epi, order, itemRows } = l;
  let n = 0, numRows = 0, slots = 0, most = 1;
  for (let x = 0; x < itemRows; x++) {
    const r = order ? order[x] : x, c = Math.max(1, Math.ceil(spans[r] / split));
    n += c;
    if (!(epi > 0 && c === 1)) {
      numRows++;
      slots += c;
    }
    if (!tuning.stage_table) continue;
    const e = rows.end[r];
    for (let j = 0; j < c; j++) {
      const k = starts[r] + j * split, ke = Math.max(k, Math.min(e, k + split));
      if (ke > k) most = Math.max(most, Math.floor((ke - 1) / bs) - Math.floor(k / bs) + 1);
    }
  }
  l.items = n;
  l.numRows = numRows;
  l.slots = slots;
  l.most = most;
}

/**
 * Sets the split workgroups, where the parts of the item table lie (items of 8 words, the block
 * table, the slopes, the row table of 4 words a row with partials, the sinks), the staged
 * block-table entries (none for token groups), the partials' bytes and the grids.
 */
function placeTable(ctx: GpuContext, tuning: DecodeTuning, s: BatchShape, l: DecodeLayout): void {
  const H = s.layer.num_heads;
  l.groups = l.items / l.wt;
  l.btOff = 8 * l.items;
  l.slopeOff = l.btOff + s.metadata.block_table.length;
  l.tokOff = l.slopeOff + H;
  l.sinkOff = l.tokOff + 4 * l.numRows;
  l.tb = l.wt > 1 ? 0 : stagedEntries(tuning, l.shape, l.epi, l.most);
  l.partBytes = partialBytes(l.slots, H, s.layer.head_size) +
    (l.epi === 2 ? l.numRows * l.perItem * 4 : 0);
  l.splitGrid = dispatchSize(ctx, l.groups * l.perItem);
  l.reduceGrid = dispatchSize(ctx, Math.max(1, l.numRows) * H);
}
