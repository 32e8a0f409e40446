/**
 * The undo log that makes a CPU_REFERENCE cache write all-or-nothing. Before a worker writes a
 * call's K/V it copies the bytes of every row the write will overwrite into a shared undo
 * buffer ({@link snapshotRows}); if the call then fails, is cancelled or its worker dies, the
 * main thread copies them back ({@link restoreRows}) and the cache is as it was.
 *
 * The log holds, for each key row t of the call with `slot_mapping[t] !== -1` and each kv head
 * h, the old K row bytes then the old V row bytes, in (t, h) order. Every entry is taken before
 * the first write, so a slot named twice holds its original bytes in both entries.
 * @module
 */
import { bytesPerElement } from "../../core/dtype.ts";
import type { HostKvCache } from "./host_cache.ts";
import { kvFromCall } from "./reference.ts";
import type { ForwardBatch } from "../../core/types.ts";

/** One row the call writes: (block, slot within the block, kv head). */
type RowAt = [block: number, slot: number, kvHead: number];

/** True when running `batch` writes into `cache` (a decoder-type call carrying K/V). */
export function writesCache(batch: ForwardBatch, cache: HostKvCache | null): boolean {
  return cache !== null && !kvFromCall(batch) && batch.key !== null && batch.value !== null;
}

/** The rows the call writes, in log order. Slots must already be checked (plan did). */
function writtenRows(batch: ForwardBatch, cache: HostKvCache): RowAt[] {
  const Hkv = batch.layer.num_kv_heads, bs = cache.spec.block_size;
  const rows: RowAt[] = [];
  for (const slot of batch.metadata.slot_mapping) {
    if (slot === -1) continue;
    for (let h = 0; h < Hkv; h++) rows.push([Math.floor(slot / bs), slot % bs, h]);
  }
  return rows;
}

function rowBytes(cache: HostKvCache): number {
  return cache.spec.head_size * bytesPerElement(cache.storage_dtype);
}

/** Bytes of undo log `batch` needs on `cache`: 0 when it writes nothing. */
export function undoBytes(batch: ForwardBatch, cache: HostKvCache | null): number {
  if (!cache || !writesCache(batch, cache)) return 0;
  let rows = 0;
  for (const slot of batch.metadata.slot_mapping) if (slot !== -1) rows++;
  return rows * batch.layer.num_kv_heads * 2 * rowBytes(cache);
}

/** Copies the current bytes of every row the call will write into `undo`. Writes no cache byte. */
export function snapshotRows(batch: ForwardBatch, cache: HostKvCache, undo: Uint8Array): void {
  const n = rowBytes(cache);
  writtenRows(batch, cache).forEach(([b, s, h], i) => {
    undo.set(cache.rowBytes("key", b, s, h), 2 * i * n);
    undo.set(cache.rowBytes("value", b, s, h), (2 * i + 1) * n);
  });
}

/** Puts back every row {@link snapshotRows} saved: the cache holds what it held before the call. */
export function restoreRows(batch: ForwardBatch, cache: HostKvCache, undo: Uint8Array): void {
  const n = rowBytes(cache);
  writtenRows(batch, cache).forEach(([b, s, h], i) => {
    cache.rowBytes("key", b, s, h).set(undo.subarray(2 * i * n, (2 * i + 1) * n));
    cache.rowBytes("value", b, s, h).set(undo.subarray((2 * i + 1) * n, (2 * i + 2) * n));
  });
}
