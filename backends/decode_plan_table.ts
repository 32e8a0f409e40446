/**
 * What a decode-row plan (backends/decode_plan.ts planDecodeRows) puts in the plan table and
 * compiles, from its layout (backends/decode_plan_layout.ts): the item table's writer
 * ({@link tableWriter}), the split kernel's constants ({@link splitConsts}) and its Params
 * uniforms ({@link splitParams}), which the reduce kernel shares.
 * @module
 */
import type { BatchShape, StorageDType } from "../core/types.ts";
import { DECODE_SPLIT, type DecodeSplitConsts } from "../gpu/decode_kernels.ts";
import { DECODE_SCALE } from "../gpu/decode_codegen.ts";
import { packUniforms } from "../gpu/kernel.ts";
import type { DecodeLayout } from "./decode_plan_layout.ts";
import type { DecodeTuning } from "./webgpu_decode_tuning.ts";

/** The item / row field of a row cut into one slice that writes its output itself. */
const NONE = 0xffffffff;

/** Whether the cache stores fp8 (its scales then apply). */
const isFp8 = (st: StorageDType) => st === "fp8_e4m3" || st === "fp8_e5m2";

/**
 * The writer of the item table (TableBuilder.addWords fills it when the plan's bytes are made):
 * 8 words an item in item order (request, token, first key, end key, partial slot, position,
 * the row's first visible key, row), the block table, the ALiBi slopes, 4 words a row with
 * partials (token, first slot, slot count, first counter) and the sinks. A row of one slice
 * that writes its output itself has NONE for slot and row.
 */
export function tableWriter(s: BatchShape, l: DecodeLayout): (tab: Uint32Array) => void {
  const { rows, starts, spans, split, epi, order, itemRows, perItem } = l;
  const { btOff, slopeOff, tokOff, sinkOff } = l;
  const bt = s.metadata.block_table, slopes = s.layer.alibi_slopes, sinks = s.layer.sinks;
  return (tab: Uint32Array) => {
    let slot = 0, it = 0, row = 0;
    for (let x = 0; x < itemRows; x++) {
      const r = order ? order[x] : x, i = rows.req[r], t = rows.token[r];
      const b = rows.begin[r], e = rows.end[r], p = rows.pos[r], start = starts[r];
      const c = Math.max(1, Math.ceil(spans[r] / split));
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
}

/** The split kernel's variant for the layout `l` of `s`'s decode rows under `tuning`. */
export function splitConsts(
  tuning: DecodeTuning,
  s: BatchShape,
  l: DecodeLayout,
): DecodeSplitConsts {
  const L = s.layer, spec = s.cache_spec!, shape = l.shape, st = l.g.storage_dtype;
  // The transposed reductions (gpu/decode_scatter.ts) halve blocks of the step's N = heads of a
  // key group x keys a step values: N must be a power of two, else the plain sums run.
  const n2 = shape.kh * shape.hg * shape.u;
  const scatterable = shape.sg && (n2 & (n2 - 1)) === 0;
  return {
    storage: st,
    dtype: s.dtype,
    d: L.head_size,
    bs: spec.block_size,
    nhd: spec.layout === "NHD",
    nchunk: l.g.nchunk,
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
    fp8_pairs: tuning.fp8_pairs && isFp8(st),
    nan_free: tuning.fp8_nan_free && st === "fp8_e4m3" && s.cache_nan_free === true,
    half: shape.half,
    indexed_gather: tuning.indexed_gather && scatterable && shape.lpk > 1 &&
      (tuning.scatter_sums || tuning.scatter_softmax),
    fma: tuning.fma_dots,
    epi: l.epi,
    tb: l.tb,
    probe: tuning.probe_residency,
    wh: shape.wh,
    wt: l.wt,
  };
}

/** The Params uniforms of the split and reduce kernels for the layout `l` of `s`'s decode rows. */
export function splitParams(s: BatchShape, l: DecodeLayout): Uint8Array<ArrayBuffer> {
  const L = s.layer, H = L.num_heads, D = L.head_size, spec = s.cache_spec!, g = l.g;
  const fp8 = isFp8(g.storage_dtype);
  return packUniforms(DECODE_SPLIT, {
    num_tokens: s.num_tokens,
    num_heads: H,
    num_kv_heads: L.num_kv_heads,
    group: H / L.num_kv_heads,
    num_items: l.groups,
    head_tiles: l.shape.tiles,
    max_blocks: s.metadata.max_blocks_per_req,
    block_size: spec.block_size,
    bt_off: l.btOff,
    slope_off: l.slopeOff,
    tok_off: l.tokOff,
    sink_off: l.sinkOff,
    ml_off: (l.slots * H * D) / 4,
    num_rows: l.numRows,
    nwg_x: l.splitGrid[0],
    nwg_x_reduce: l.reduceGrid[0],
    block_words: g.block_words,
    blocks_per_chunk: g.blocks_per_chunk,
    score_scale: L.scale * (fp8 ? L.k_scale : 1) * DECODE_SCALE[g.storage_dtype],
    soft_cap: L.logits_soft_cap ?? 1,
    v_scale: (fp8 ? L.v_scale : 1) * DECODE_SCALE[g.storage_dtype],
    has_sink: L.sinks ? 1 : 0,
    neg_inf: -Infinity,
    cnt_off: l.slots * H * (D + 4),
  });
}
