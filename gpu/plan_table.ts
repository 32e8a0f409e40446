/**
 * A plan's immutable GPU data in one array, uploaded with one write: every kernel's `Params`
 * block and every metadata table (tiles, block table, slot mapping, slopes, sinks), each
 * section at a 256-byte aligned offset (the offset alignment WebGPU guarantees for uniform and
 * storage bindings). Built once per plan; a GPU plan keeps the bytes and every call writes them
 * into a pooled buffer with its other uploads (gpu/gpu_plan.ts); {@link uploadTable} gives a
 * buffer of its own to those that launch outside a call (the cache writer, benches).
 *
 * A decode step plans anew (new seq_lens and slots), so the table's memory is lent from
 * {@link TABLE_MEMORY} (size classes; a fresh 35 KiB ArrayBuffer cost tens of microseconds
 * on the profile machine, the allocation and the collector's work on external memory) and
 * returned when the plan is disposed; a section may be written in place when the bytes are
 * made ({@link TableBuilder.addWords}) instead of being built in an array of its own first.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { sizeClass } from "./buffer_pool.ts";

/** The usage of a buffer holding a table (uniform and storage sections, written by copy). */
export const TABLE_USAGE = GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE |
  GPUBufferUsage.COPY_DST;

/** A section of a plan table. */
export interface Section {
  offset: number;
  size: number;
}

/** The uploaded table. */
export interface PlanTable {
  readonly buffer: GPUBuffer;
  /** A binding of one section. */
  bind(s: Section): { buffer: GPUBuffer; offset: number; size: number };
}

/** Host memory lent to one table until `release()`. */
export interface TableLease {
  /** Zero-filled, at offset 0 of a pooled buffer. */
  readonly bytes: Uint8Array<ArrayBuffer>;
  /** Returns the memory (idempotent); nothing may read `bytes` afterwards. */
  release(): void;
}

/** Free table memory by size class (4 KiB and up); at most `maxFree` buffers a class. */
export class TableMemory {
  #free = new Map<number, ArrayBuffer[]>();
  #created = 0;
  #reused = 0;
  constructor(readonly maxFree = 64) {}

  /** `bytes` zero-filled bytes. */
  acquire(bytes: number): TableLease {
    const size = sizeClass(bytes, 4096);
    let buf = this.#free.get(size)?.pop();
    const view = buf ? new Uint8Array(buf, 0, bytes).fill(0) : null;
    if (buf) this.#reused++;
    else {
      this.#created++;
      buf = new ArrayBuffer(size);
    }
    const owned = buf;
    let done = false;
    return {
      bytes: view ?? new Uint8Array(owned, 0, bytes),
      release: () => {
        if (done) return;
        done = true;
        let l = this.#free.get(size);
        if (!l) this.#free.set(size, l = []);
        if (l.length < this.maxFree) l.push(owned);
      },
    };
  }

  stats(): { created: number; reused: number } {
    return { created: this.#created, reused: this.#reused };
  }
}

/** The process's table memory (plans' tables are host memory, not per device). */
export const TABLE_MEMORY: TableMemory = new TableMemory();

/** A section's content: bytes to copy, or a writer filling it in place. */
type Part =
  | { offset: number; bytes: Uint8Array }
  | { offset: number; words: number; write: (dst: Uint32Array) => void };

/** Collects sections, then uploads them in one write. */
export class TableBuilder {
  #parts: Part[] = [];
  #size = 0;

  #place(byteLength: number): Section {
    const align = 256;
    const offset = Math.ceil(this.#size / align) * align;
    const size = Math.max(16, Math.ceil(byteLength / 16) * 16);
    this.#size = offset + size;
    return { offset, size };
  }

  /** Adds a section holding `data` (at least 16 bytes are bound, zero padded). */
  add(data: ArrayBufferView): Section {
    const s = this.#place(data.byteLength);
    this.#parts.push({
      offset: s.offset,
      bytes: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
    });
    return s;
  }

  /**
   * Adds a section of `words` u32 that `write` fills (it starts zeroed) when the bytes are made:
   * a large table goes straight into the plan's table. `write` may run later than this call,
   * so it must not read state that changes in between.
   */
  addWords(words: number, write: (dst: Uint32Array) => void): Section {
    const s = this.#place(4 * words);
    this.#parts.push({ offset: s.offset, words, write });
    return s;
  }

  /** Bytes of the table so far. */
  get size(): number {
    return this.#size;
  }

  /** Bytes of the table {@link bytes} makes (at least 256, a multiple of 16). */
  get byteLength(): number {
    return Math.max(256, Math.ceil(this.#size / 16) * 16);
  }

  /**
   * Every section at its offset, in one array: a new one, or `into` (zero-filled, at least
   * {@link byteLength} bytes; a lease of {@link TABLE_MEMORY}).
   */
  bytes(into?: Uint8Array<ArrayBuffer>): Uint8Array<ArrayBuffer> {
    const n = this.byteLength;
    const all = into ? into.subarray(0, n) : new Uint8Array(n);
    for (const p of this.#parts) {
      if ("bytes" in p) all.set(p.bytes, p.offset);
      else p.write(new Uint32Array(all.buffer, all.byteOffset + p.offset, p.words));
    }
    return all;
  }

  /** Creates the buffer and writes every section with one `writeBuffer`. */
  upload(ctx: GpuContext, label: string): PlanTable {
    return uploadTable(ctx, this.bytes(), label);
  }
}

/** A buffer holding `all` (a {@link TableBuilder.bytes} result), written with one `writeBuffer`. */
export function uploadTable(
  ctx: GpuContext,
  all: Uint8Array<ArrayBuffer>,
  label: string,
): PlanTable {
  const buffer = ctx.device.createBuffer({ label, size: all.byteLength, usage: TABLE_USAGE });
  ctx.device.queue.writeBuffer(buffer, 0, all);
  return { buffer, bind: (s) => ({ buffer, offset: s.offset, size: s.size }) };
}
