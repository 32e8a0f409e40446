/**
 * The batch-metadata checks of forward validation (vLLM's CommonAttentionMetadata):
 * `query_start_loc`, `seq_lens`, `block_table` (ids in range, enough columns, no block twice in
 * one request's row) and `slot_mapping` (one per key row, in range or -1, no slot twice),
 * without a map on the way of a valid batch (a map is built only to name the repeats).
 * @module
 */
import type { AttnType, KvCacheSpec } from "../core/types.ts";
import type { IntTensor } from "../wire/tensors.ts";
import { fmt, isEncoder, type Issues } from "./validate_layer.ts";

/** The metadata as the request gives it. */
export interface MetadataInput {
  query_start_loc: IntTensor;
  seq_lens: IntTensor;
  block_table?: IntTensor;
  slot_mapping?: IntTensor;
}

/** What the metadata checks derive. */
export interface CheckedMetadata {
  num_reqs: number;
  query_lens: Int32Array;
  block_table: Int32Array;
  max_blocks_per_req: number;
  slot_mapping: Int32Array;
  /**
   * `query_start_loc` and `seq_lens` broke no rule, so the query lengths and sequence lengths
   * can be counted (the attended keys the per-call limit is checked against).
   */
  counts_valid: boolean;
}

const mp = (k: string, ...rest: (string | number)[]) => ["metadata", k, ...rest];

/**
 * Marks of block ids seen in the current block-table row: `marks[b] === stamp` means block b
 * was seen in this row. Every row takes a new stamp, so nothing is cleared between rows or
 * calls (validation is synchronous, so one array serves every call).
 */
class Stamps {
  marks = new Int32Array(0);
  #stamp = 0;
  /** A stamp no entry holds yet. */
  next(): number {
    if (this.#stamp >= 0x7fffffff) {
      this.marks.fill(0);
      this.#stamp = 0;
    }
    return ++this.#stamp;
  }
}
const stamps = new Stamps();

/** The shared marks, with room for block ids [0, n). */
function blockStamps(n: number): Stamps {
  if (stamps.marks.length < n) {
    stamps.marks = new Int32Array(Math.max(n, 2 * stamps.marks.length));
  }
  return stamps;
}

/** Marks of slots seen in this call (as {@link blockStamps}, a separate array). */
const slotStamps = new Stamps();

/** Caches with more slots than this are checked for repeated slots by sorting a copy. */
const SLOT_STAMPS_MAX = 1 << 22;

/** Whether a slot is out of range (-1 or [0, nSlots) are in) or repeated (-1 may repeat). */
function slotsBadByStamps(slots: Int32Array, nSlots: number): boolean {
  if (slotStamps.marks.length < nSlots) {
    slotStamps.marks = new Int32Array(Math.max(nSlots, 2 * slotStamps.marks.length));
  }
  const marks = slotStamps.marks, stamp = slotStamps.next();
  for (let t = 0; t < slots.length; t++) {
    const s = slots[t];
    if (s === -1) continue;
    if (s < 0 || s >= nSlots || marks[s] === stamp) return true;
    marks[s] = stamp;
  }
  return false;
}

/** {@link slotsBadByStamps} for huge caches: the range in one pass, repeats on a sorted copy. */
function slotsBadBySort(slots: Int32Array, nSlots: number): boolean {
  for (let t = 0; t < slots.length; t++) {
    if (slots[t] !== -1 && (slots[t] < 0 || slots[t] >= nSlots)) return true;
  }
  const sorted = Int32Array.from(slots).sort();
  for (let t = 1; t < sorted.length; t++) {
    if (sorted[t] === sorted[t - 1] && sorted[t] !== -1) return true;
  }
  return false;
}

/** query_start_loc and seq_lens; returns the query lengths (empty when malformed). */
function checkStarts(
  md: MetadataInput,
  T: number,
  attn: AttnType,
  is: Issues,
): Int32Array {
  const qsl = md.query_start_loc.values, sl = md.seq_lens.values;
  if (md.query_start_loc.shape.length !== 1 || qsl.length < 1) {
    is.add(
      mp("query_start_loc"),
      `must be 1-D with num_reqs + 1 >= 1 entries, got shape ${fmt(md.query_start_loc.shape)}`,
    );
  }
  const R = Math.max(qsl.length - 1, 0);
  const qlen = new Int32Array(R);
  let monotone = true;
  if (qsl.length > 0 && qsl[0] !== 0) is.add(mp("query_start_loc", 0), `must be 0, got ${qsl[0]}`);
  for (let i = 0; i < R; i++) {
    // Compared as numbers: a length stored first in the Int32Array wraps (2^31 - 1 - (-2^31)
    // became non-negative, and the batch went on to plan 2^31 tiles).
    const a = qsl[i], b = qsl[i + 1];
    if (b < a) {
      monotone = false;
      is.add(
        mp("query_start_loc", i + 1),
        `must be >= the previous entry ${a}, got ${b} (non-decreasing)`,
      );
    } else if (b > T) {
      monotone = false;
      is.add(mp("query_start_loc", i + 1), `must be <= num_tokens ${T}, got ${b}`);
    } else qlen[i] = b - a;
  }
  if (qsl.length > 0 && qsl[R] !== T) {
    is.add(mp("query_start_loc", R), `last entry must equal num_tokens ${T}, got ${qsl[R]}`);
  }
  if (md.seq_lens.shape.length !== 1 || sl.length !== R) {
    is.add(
      mp("seq_lens"),
      `must have num_reqs = ${R} entries, got shape ${fmt(md.seq_lens.shape)}`,
    );
    return qlen;
  }
  for (let i = 0; i < R; i++) {
    const s = sl[i];
    if (s < 0) is.add(mp("seq_lens", i), `must be >= 0, got ${s}`);
    else if (!monotone) continue;
    else if (isEncoder(attn) && s !== qlen[i]) {
      is.add(mp("seq_lens", i), `must equal the query length ${qlen[i]} for ${attn}, got ${s}`);
    } else if (attn === "decoder" && s < qlen[i]) {
      is.add(mp("seq_lens", i), `${s} is shorter than request ${i}'s query length ${qlen[i]}`);
    } else if (attn === "encoder_decoder" && qlen[i] > 0 && s < 1) {
      is.add(mp("seq_lens", i), `request ${i} has queries but no encoder keys (seq_len ${s})`);
    }
  }
  return qlen;
}

/** The block table: shape, enough columns, ids in range, no id twice in a request's row. */
function checkBlockTable(
  md: MetadataInput,
  R: number,
  spec: KvCacheSpec | null,
  attn: AttnType,
  is: Issues,
): { table: Int32Array; maxBlocks: number } {
  const sl = md.seq_lens.values;
  const bt = md.block_table;
  if (!bt) {
    if (!isEncoder(attn)) is.add(mp("block_table"), `attn_type ${attn} needs a block_table`);
    return { table: new Int32Array(0), maxBlocks: 0 };
  }
  let maxBlocks = 0;
  let shaped = true;
  if (bt.shape.length === 2 && bt.shape[0] === R) maxBlocks = bt.shape[1];
  else if (bt.shape.length === 1 && R > 0 && bt.values.length % R === 0) {
    maxBlocks = bt.values.length / R;
  } else if (bt.shape.length === 1 && R === 0 && bt.values.length === 0) {
    maxBlocks = 0; // `[]` for an empty batch
  } else {
    shaped = false;
    is.add(
      mp("block_table"),
      `must be [num_reqs = ${R}, max_blocks_per_req], got shape ${fmt(bt.shape)}`,
    );
  }
  const table = bt.values;
  if (shaped && table.length !== R * maxBlocks) {
    // The structural check (validate_input.ts) answers this first; never skip the ids silently.
    is.add(
      mp("block_table"),
      `has ${table.length} entries but num_reqs x max_blocks_per_req = ${R} x ${maxBlocks} needs ${
        R * maxBlocks
      }`,
    );
  }
  if (!spec || sl.length !== R || table.length !== R * maxBlocks) return { table, maxBlocks };
  const seen = blockStamps(spec.num_blocks);
  for (let i = 0; i < R; i++) {
    const need = Math.ceil(Math.max(sl[i], 0) / spec.block_size);
    if (need > maxBlocks) {
      is.add(
        mp("block_table", i),
        `request ${i} (seq_len ${
          sl[i]
        }) needs ${need} blocks of ${spec.block_size}, block_table has ${maxBlocks} columns`,
      );
    }
    const row = i * maxBlocks, stamp = seen.next();
    for (let j = 0; j < Math.min(need, maxBlocks); j++) {
      const b = table[row + j];
      if (b < 0 || b >= spec.num_blocks) {
        is.add(mp("block_table", i, j), `block id ${b} out of range [0, ${spec.num_blocks})`);
        continue;
      }
      if (seen.marks[b] === stamp) {
        const prev = table.subarray(row, row + j).indexOf(b);
        is.add(
          mp("block_table", i, j),
          `block id ${b} repeats block_table[${i}][${prev}]: a request maps each logical block to its own physical block`,
        );
      } else seen.marks[b] = stamp;
    }
  }
  return { table, maxBlocks };
}

/** The slot mapping: one entry per key row, -1 or in range, no slot twice. */
function checkSlots(
  md: MetadataInput,
  Tk: number,
  spec: KvCacheSpec | null,
  attn: AttnType,
  is: Issues,
): Int32Array {
  const sm = md.slot_mapping;
  if (!sm) {
    if (!isEncoder(attn) && Tk > 0) {
      is.add(mp("slot_mapping"), `attn_type ${attn} needs a slot_mapping`);
    }
    return new Int32Array(Tk).fill(-1);
  }
  if (sm.shape.length !== 1 || sm.values.length !== Tk) {
    is.add(
      mp("slot_mapping"),
      `must have one entry per key token (${Tk}), got shape ${fmt(sm.shape)}`,
    );
    return sm.values;
  }
  if (!spec) return sm.values;
  const slots = sm.values;
  const nSlots = spec.num_blocks * spec.block_size;
  // The common case in one pass without a map or a sorted copy: each slot is -1 or in range
  // and not marked yet in this call's stamp (a cache of more than SLOT_STAMPS_MAX slots sorts a
  // copy instead). Only a batch that fails is walked again to name each problem, in order, with
  // the entry a repeat duplicates.
  const bad = nSlots <= SLOT_STAMPS_MAX
    ? slotsBadByStamps(slots, nSlots)
    : slotsBadBySort(slots, nSlots);
  if (!bad) return slots;
  const seen = new Map<number, number>();
  for (let t = 0; t < Tk; t++) {
    const s = slots[t];
    if (s === -1) continue;
    if (s < 0 || s >= nSlots) {
      is.add(
        mp("slot_mapping", t),
        `slot ${s} out of range: -1 or [0, ${nSlots}) (num_blocks ${spec.num_blocks} x block_size ${spec.block_size})`,
      );
      continue;
    }
    const prev = seen.get(s);
    if (prev !== undefined) {
      is.add(mp("slot_mapping", t), `slot ${s} duplicates slot_mapping[${prev}]`);
    } else seen.set(s, t);
  }
  return slots;
}

/** Checks all of the metadata; `T` query tokens, `Tk` key rows, `spec` the cache (or null). */
export function checkMetadata(
  md: MetadataInput,
  T: number,
  Tk: number,
  spec: KvCacheSpec | null,
  attn: AttnType,
  is: Issues,
): CheckedMetadata {
  const before = is.count;
  const query_lens = checkStarts(md, T, attn, is);
  const counts_valid = is.count === before;
  const R = query_lens.length;
  const { table, maxBlocks } = checkBlockTable(md, R, spec, attn, is);
  const slot_mapping = checkSlots(md, Tk, spec, attn, is);
  return {
    num_reqs: R,
    query_lens,
    block_table: table,
    max_blocks_per_req: maxBlocks,
    slot_mapping,
    counts_valid,
  };
}
