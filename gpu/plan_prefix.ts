/**
 * The part of every GPU plan that comes before the backend's attention calls and depends on
 * the batch's shape alone, not on its metadata values: the device's finiteness check of a
 * large call's data, the cache write of the call's new K/V (its slot table is the one
 * metadata section), the poisoning of the output and, when the call returns it, the LSE. {@link planPrefix} builds it once
 * per shape and device and replays it for every later plan of that shape: the same sections
 * in the same order (so the same offsets), the call's own `slot_mapping` in the slot
 * section. A decode step's plan misses the plan cache every step (new seq_lens and slots);
 * this way its miss only redoes what the metadata changes (the backend's work items).
 * @module
 */
import type { BatchShape, GpuContext } from "../core/types.ts";
import { checksFiniteOnDevice, dataElements } from "../core/data.ts";
import { planCacheWrite } from "./cache_write.ts";
import { kvChunkGeometry } from "./kv_cache.ts";
import { MAX_KV_CHUNK_BYTES } from "./kv_chunks.ts";
import { planFiniteCheck } from "./finite_check.ts";
import { planFill } from "./fill.ts";
import { outputWords, type PlannedCall, poisonCalls } from "./gpu_plan.ts";
import { type Section, TableBuilder } from "./plan_table.ts";

/** What {@link planPrefix} adds to a plan. */
export interface PlanPrefix {
  calls: readonly PlannedCall[];
  kernels: readonly string[];
  /** The plan checks the data on the device (gpu/finite_check.ts). */
  checks: boolean;
  /** Words of the output buffer; LSE words. */
  out_words: number;
  lse_words: number;
}

/** A built prefix and the sections it adds, in order (`null`: the call's slot_mapping). */
interface Recorded {
  prefix: PlanPrefix;
  sections: (ArrayBufferView | null)[];
}

/** Shapes kept per device (a process sees few). */
const MEMO_LIMIT = 64;
const memos = new WeakMap<GPUDevice, Map<string, Recorded>>();

/** Passes each section to `target`, noting it (`null` for the batch's slot table). */
class RecordingTable extends TableBuilder {
  constructor(
    readonly target: TableBuilder,
    readonly slots: Int32Array,
    readonly log: (ArrayBufferView | null)[],
  ) {
    super();
  }
  override add(data: ArrayBufferView): Section {
    this.log.push(data === this.slots ? null : data);
    return this.target.add(data);
  }
}

/**
 * Everything the prefix depends on besides the device: the batch's shape, the context's
 * limits that lay a cache out in chunks (gpu/kv_chunks.ts kvChunkGeometry), which a context may
 * set below the device's (MAX_KV_CHUNK_BYTES, a lower binding size: the tests' multi-chunk
 * caches; one device, several chunk layouts, and a prefix of another layout bound the wrong
 * buffers), and the grid limit its calls' 2-D grids are cut to (a prefix planned under a higher
 * one kept grids wider than a lower one allows).
 */
function shapeKey(ctx: GpuContext, s: BatchShape): string {
  const L = s.layer, c = s.cache_spec, lim = ctx.limits;
  return [
    lim[MAX_KV_CHUNK_BYTES] ?? "-",
    lim.maxStorageBufferBindingSize ?? "-",
    lim.maxBufferSize ?? "-",
    lim.maxStorageBuffersPerShaderStage ?? "-",
    lim.maxComputeWorkgroupsPerDimension ?? "-",
    s.dtype,
    L.num_heads,
    L.num_kv_heads,
    L.head_size,
    L.k_scale,
    L.v_scale,
    s.num_tokens,
    s.num_kv_tokens,
    s.metadata.slot_mapping.length,
    s.return_lse,
    c ? `${c.num_blocks}x${c.block_size}:${c.kv_cache_dtype}:${c.layout}:${c.dtype}` : "-",
  ].join("|");
}

/** The check call of a batch whose data the device checks (gpu/finite_check.ts). */
async function finiteCheckCalls(
  ctx: GpuContext,
  s: BatchShape,
  table: TableBuilder,
): Promise<PlannedCall[]> {
  const fc = await planFiniteCheck(ctx, s.dtype, dataElements(s), table);
  // Without key/value rows the query is bound in their place (their word counts are 0).
  const kv = s.num_kv_tokens > 0 ? ["key", "value"] as const : ["query", "query"] as const;
  return [
    {
      name: "finite_check",
      kernel: fc.check,
      bind: {
        P: { table: fc.checkParams },
        q: { io: "query" },
        k: { io: kv[0] },
        v: { io: kv[1] },
        flags: { io: "flags" },
      },
      grid: fc.grid,
    },
  ];
}

/** Builds the prefix of `s` into `table` (see the module doc). */
async function buildPrefix(
  ctx: GpuContext,
  s: BatchShape,
  table: TableBuilder,
): Promise<PlanPrefix> {
  const L = s.layer;
  const calls: PlannedCall[] = [];
  const kernels: string[] = [];
  const checks = checksFiniteOnDevice(s);
  const cw = s.cache_spec && s.num_kv_tokens > 0
    ? await planCacheWrite(
      ctx,
      s.cache_spec,
      s.dtype,
      s.metadata.slot_mapping,
      { k_scale: L.k_scale, v_scale: L.v_scale },
      table,
      kvChunkGeometry(ctx, s.cache_spec),
      checks,
    )
    : null;
  if (checks) calls.push(...await finiteCheckCalls(ctx, s, table));
  if (cw) {
    calls.push({
      name: "cache_write",
      kernel: cw.kernel,
      bind: {
        P: { table: cw.params },
        key_new: { io: "key" },
        value_new: { io: "value" },
        slots: { table: cw.slots },
        // Behind the check, the write reads its flags and writes nothing on a NaN.
        ...(checks ? { flags: { io: "flags" } as const } : {}),
      },
      cache: true,
      grid: cw.grid,
    });
    kernels.push(cw.kernel.key);
  }
  const out = outputWords(s.dtype, s.num_tokens * L.num_heads * L.head_size);
  const lseWords = s.num_tokens * L.num_heads;
  // The LSE is poisoned only when the call reads it back (nothing else reads it).
  const [fo, fl] = await Promise.all([
    planFill(ctx, out.words, out.pattern, table),
    s.return_lse ? planFill(ctx, lseWords, 0x7fc00000, table) : null,
  ]);
  calls.push(...poisonCalls(fo, fl));
  return { calls, kernels, checks, out_words: out.words, lse_words: lseWords };
}

/**
 * Adds the prefix of `s` to `table` (which must be empty: the prefix's sections come first)
 * and returns its calls: built on the first plan of this shape on `ctx`'s device, replayed
 * after that.
 */
export async function planPrefix(
  ctx: GpuContext,
  s: BatchShape,
  table: TableBuilder,
): Promise<PlanPrefix> {
  if (table.size !== 0) throw new Error("planPrefix: the table must be empty");
  let memo = memos.get(ctx.device);
  if (!memo) memos.set(ctx.device, memo = new Map());
  const key = shapeKey(ctx, s);
  const hit = memo.get(key);
  if (hit) {
    for (const b of hit.sections) table.add(b ?? s.metadata.slot_mapping);
    return hit.prefix;
  }
  // Record what the builders add; the slot table is the batch's own array (the one metadata).
  const sections: (ArrayBufferView | null)[] = [];
  const recording = new RecordingTable(table, s.metadata.slot_mapping, sections);
  const prefix = await buildPrefix(ctx, s, recording);
  if (memo.size >= MEMO_LIMIT) memo.delete(memo.keys().next().value!);
  memo.set(key, { prefix, sections });
  return prefix;
}
