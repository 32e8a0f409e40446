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
 * What it adds to a plan (backends/decode_rows_plan.ts) and the partials' sizes
 * (backends/decode_partials.ts) live in their own modules, re-exported here.
 * @module
 */
import type { BatchShape, GpuContext } from "../core/types.ts";
import { dispatchSize } from "../gpu/batch_buffers.ts";
import { DECODE_REDUCE, DECODE_SPLIT, type DecodeSplitConsts } from "../gpu/decode_kernels.ts";
import { DECODE_SCALE } from "../gpu/decode_codegen.ts";
import type { BindRef, PlannedCall } from "../gpu/gpu_plan.ts";
import { compiledKernel, getKernel, packUniforms } from "../gpu/kernel.ts";
import { kvChunkGeometry } from "../gpu/kv_cache.ts";
import type { TableBuilder } from "../gpu/plan_table.ts";
import { elementsPerWord } from "../gpu/wgsl.ts";
import { decodeShape, epilogueMode, stagedEntries } from "./decode_shape.ts";
import { sliceLength } from "./decode_split_policy.ts";
import { decodeRowRanges, longestFirst, severalRows, tokenGroups } from "./decode_rows.ts";
import { RESIDENCY_BUFFER, RESIDENCY_INFO } from "../gpu/decode_residency.ts";
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";
import { FUSED_PART_BYTES, partialBytes, partialLimit } from "./decode_partials.ts";
import type { DecodeRowsPlan } from "./decode_rows_plan.ts";

export { FUSED_PART_BYTES, partialBytes, partialLimit } from "./decode_partials.ts";
export type { DecodeRowsPlan } from "./decode_rows_plan.ts";

/** The item / row field of a row cut into one slice that writes its output itself. */
const NONE = 0xffffffff;

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
  const L = s.layer, md = s.metadata, T = s.num_tokens, spec = s.cache_spec!;
  const H = L.num_heads, Hkv = L.num_kv_heads, D = L.head_size;
  const rows = decodeRowRanges(s, reqs);
  const R = rows.count;
  if (R === 0) return null;
  const g = kvChunkGeometry(ctx, spec);
  const shape = decodeShape(ctx, tuning, L, spec, g.storage_dtype);
  const perItem = (Hkv / shape.kh / shape.wh) * shape.tiles;
  const nkg = shape.wg / shape.lpk;
  // Slices start at multiples of U (a step's keys then share a block); the first one masks
  // the keys before the range's true begin.
  const starts: number[] = [], spans: number[] = [];
  for (let r = 0; r < R; r++) {
    const b = rows.begin[r], e = rows.end[r];
    starts.push(e > b ? b - (b % shape.u) : b);
    spans.push(e - starts[r]);
  }
  let split = sliceLength(tuning, {
    spans,
    perItem,
    step: nkg * shape.u,
    target: shape.target,
    wave: shape.wave,
    weight: shape.wh,
  });
  let epi = epilogueMode(ctx, tuning, shape, g.nchunk);
  // Partial slots: every item (epi 0), else the items of rows cut into several.
  const slotsAt = (x: number) => {
    let n = 0;
    for (let r = 0; r < R; r++) {
      const c = Math.max(1, Math.ceil(spans[r] / x));
      n += epi > 0 && c === 1 ? 0 : c;
    }
    return n;
  };
  const partLimit = partialLimit(ctx);
  while (partialBytes(slotsAt(split), H, D) > partLimit && split < 2 ** 30) split *= 2;
  // The fused reduce's partials stay allocated on the device: big ones take the reduce pass.
  if (epi === 2 && partialBytes(slotsAt(split), H, D) > FUSED_PART_BYTES) epi = 1;
  // direct_single changes nothing when every row is cut: keep the plain kernel then.
  if (epi === 1 && spans.every((sp) => sp > split)) epi = 0;
  // Token items a workgroup spans: only where every row is one slice written by its epilogue.
  const grouped = epi > 0 && spans.every((sp) => sp <= split) ? tokenGroups(rows, shape.wt) : null;
  const wt = grouped ? shape.wt : 1;
  // The rows in item order: token groups' (each row one direct slice), else as they came;
  // under `longest_first` each request's groups from the longest to the shortest.
  const order = tuning.longest_first && severalRows(rows)
    ? longestFirst(grouped ?? spans.map((_, r) => r), wt, rows.req, spans)
    : grouped;
  const itemRows = order?.length ?? R, rowAt = (x: number) => (order ? order[x] : x);
  const reordered = order !== grouped && order!.some((r, x) => r !== (grouped ? grouped[x] : x));
  // Item and row counts (and the most blocks an item spans) first; the table is written in
  // place when the plan's bytes are made: items (8 words each), block table, slopes, row table
  // (token, first slot, slot count, first counter), sinks.
  const bs = spec.block_size;
  let n = 0, numRows = 0, slots = 0, most = 1;
  for (let x = 0; x < itemRows; x++) {
    const r = rowAt(x), c = Math.max(1, Math.ceil(spans[r] / split));
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
  const groups = n / wt; // workgroups per (kv head block, head tile)
  const btOff = 8 * n, slopeOff = btOff + md.block_table.length;
  const tokOff = slopeOff + H, sinkOff = tokOff + 4 * numRows;
  const tb = grouped ? 0 : stagedEntries(tuning, shape, epi, most);
  // The transposed reductions (gpu/decode_scatter.ts) halve blocks of the step's N = heads of a
  // key group x keys a step values: N must be a power of two, else the plain sums run.
  const n2 = shape.kh * shape.hg * shape.u;
  const scatterable = shape.sg && (n2 & (n2 - 1)) === 0;
  const bt = md.block_table, slopes = L.alibi_slopes, sinks = L.sinks;
  const writeTable = (tab: Uint32Array) => {
    let slot = 0, it = 0, row = 0;
    for (let x = 0; x < itemRows; x++) {
      const r = rowAt(x), i = rows.req[r], t = rows.token[r], b = rows.begin[r], e = rows.end[r];
      const p = rows.pos[r], start = starts[r], c = Math.max(1, Math.ceil(spans[r] / split));
      const direct = epi > 0 && c === 1;
      const rowId = direct ? NONE : row;
      if (!direct) {
        const o = tokOff + 4 * row++;
        tab[o] = t;
        tab[o + 1] = slot;
        tab[o + 2] = c;
        tab[o + 3] = rowId * perItem;
      }
      for (let j = 0; j < c; j++, it += 8) {
        const k = start + j * split;
        tab[it] = i;
        tab[it + 1] = t;
        tab[it + 2] = k;
        tab[it + 3] = Math.max(k, Math.min(e, k + split));
        tab[it + 4] = direct ? NONE : slot++;
        tab[it + 5] = p;
        tab[it + 6] = b;
        tab[it + 7] = rowId;
      }
    }
    tab.set(new Uint32Array(bt.buffer, bt.byteOffset, bt.length), btOff);
    const f = new Float32Array(tab.buffer, tab.byteOffset, tab.length);
    if (slopes) f.set(slopes, slopeOff);
    if (sinks) f.set(sinks, sinkOff);
  };
  const fp8 = g.storage_dtype === "fp8_e4m3" || g.storage_dtype === "fp8_e5m2";
  const splitGrid = dispatchSize(ctx, groups * perItem);
  const reduceGrid = dispatchSize(ctx, Math.max(1, numRows) * H);
  const consts: DecodeSplitConsts = {
    storage: g.storage_dtype,
    dtype: s.dtype,
    d: D,
    bs: spec.block_size,
    nhd: spec.layout === "NHD",
    nchunk: g.nchunk,
    hg: shape.hg,
    kh: shape.kh,
    u: shape.u,
    lpk: shape.lpk,
    wg: shape.wg,
    sg: shape.sg,
    cap: L.logits_soft_cap !== null,
    alibi: L.alibi_slopes !== null,
    early_v: tuning.early_values,
    prefetch: tuning.prefetch && shape.skv === 0,
    skv: shape.skv,
    scatter: tuning.scatter_sums && scatterable,
    scatter_softmax: tuning.scatter_softmax && scatterable && shape.lpk > 1,
    fp8_pairs: tuning.fp8_pairs && fp8,
    nan_free: tuning.fp8_nan_free && g.storage_dtype === "fp8_e4m3" && s.cache_nan_free === true,
    half: shape.half,
    indexed_gather: tuning.indexed_gather && scatterable && shape.lpk > 1 &&
      (tuning.scatter_sums || tuning.scatter_softmax),
    fma: tuning.fma_dots,
    epi,
    tb,
    probe: tuning.probe_residency,
    wh: shape.wh,
    wt,
  };
  const params = table.add(packUniforms(DECODE_SPLIT, {
    num_tokens: T,
    num_heads: H,
    num_kv_heads: Hkv,
    group: H / Hkv,
    num_items: groups,
    head_tiles: shape.tiles,
    max_blocks: md.max_blocks_per_req,
    block_size: spec.block_size,
    bt_off: btOff,
    slope_off: slopeOff,
    tok_off: tokOff,
    sink_off: sinkOff,
    ml_off: (slots * H * D) / 4,
    num_rows: numRows,
    nwg_x: splitGrid[0],
    nwg_x_reduce: reduceGrid[0],
    block_words: g.block_words,
    blocks_per_chunk: g.blocks_per_chunk,
    score_scale: L.scale * (fp8 ? L.k_scale : 1) * DECODE_SCALE[g.storage_dtype],
    soft_cap: L.logits_soft_cap ?? 1,
    v_scale: (fp8 ? L.v_scale : 1) * DECODE_SCALE[g.storage_dtype],
    has_sink: L.sinks ? 1 : 0,
    neg_inf: -Infinity,
    cnt_off: slots * H * (D + 4),
  }));
  const tabSec = table.addWords(sinkOff + H, writeTable);
  // Sections are added before the first await: the table's layout then follows the order the
  // planners were called in, whatever order the kernels resolve in (stable bindings).
  const reduce = epi < 2 && numRows > 0;
  // Compiled already (every step after the first): no await.
  const reduceConsts = { d: D, dtype: s.dtype };
  let split_k = compiledKernel(ctx, DECODE_SPLIT, consts);
  let reduce_k = reduce ? compiledKernel(ctx, DECODE_REDUCE, reduceConsts) : null;
  if (!split_k || (reduce && !reduce_k)) {
    [split_k, reduce_k] = await Promise.all([
      getKernel(ctx, DECODE_SPLIT, consts),
      reduce ? getKernel(ctx, DECODE_REDUCE, reduceConsts) : null,
    ]);
  }
  // Partials and counters: pooled scratch, or under the fused reduce the device's own zeroed
  // buffer (wgsl/decode_fused.wgsl: every word zero between its dispatches).
  const partBytes = partialBytes(slots, H, D) + (epi === 2 ? numRows * perItem * 4 : 0);
  const part: BindRef = epi === 2
    ? { persistent: "decode_fused_part", bytes: partBytes }
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
    grid: splitGrid,
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
      grid: reduceGrid,
    });
  }
  return {
    calls,
    part_bytes: Math.max(16, epi === 2 ? 16 : partBytes),
    rows: R,
    items: n,
    split_keys: split,
    split_rows: numRows,
    epilogue: epi,
    table_entries: tb,
    staged_kv: shape.skv,
    geometry: {
      decode_workgroups: groups * perItem,
      decode_reduce_workgroups: reduce_k ? numRows * H : 0,
      decode_steps: Math.ceil(split / ((nkg / shape.wh / wt) * shape.u)),
      decode_waves_x1000: Math.round(
        (1000 * groups * perItem) / shape.wave,
      ),
      decode_wg_invocations: shape.wg,
      decode_wg_kv_heads: shape.wh,
      decode_wg_tokens: wt,
      decode_longest_first: reordered ? 1 : 0,
      [RESIDENCY_INFO]: tuning.probe_residency ? 1 : 0,
    },
    key: split_k.key,
  };
}

/** Elements per u32 word of the cache's storage (re-exported for the descriptor). */
export { elementsPerWord };
