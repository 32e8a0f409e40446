/**
 * A plan's immutable GPU data in one array, uploaded with one write: every kernel's `Params`
 * block and every metadata table (tiles, block table, slot mapping, slopes, sinks), each
 * section at a 256-byte aligned offset (the offset alignment WebGPU guarantees for uniform and
 * storage bindings). Built once per plan; a GPU plan keeps the bytes and every call writes them
 * into a pooled buffer with its other uploads (gpu/gpu_plan.ts); {@link uploadTable} gives a
 * buffer of its own to those that launch outside a call (the cache writer, benches).
 * @module
 */
import type { GpuContext } from "../core/types.ts";

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

/** Collects sections, then uploads them in one write. */
export class TableBuilder {
  #parts: { offset: number; bytes: Uint8Array }[] = [];
  #size = 0;

  /** Adds a section holding `data` (at least 16 bytes are bound, zero padded). */
  add(data: ArrayBufferView): Section {
    const align = 256;
    const offset = Math.ceil(this.#size / align) * align;
    const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    const size = Math.max(16, Math.ceil(bytes.byteLength / 16) * 16);
    this.#parts.push({ offset, bytes });
    this.#size = offset + size;
    return { offset, size };
  }

  /** Bytes of the table so far. */
  get size(): number {
    return this.#size;
  }

  /** Every section at its offset, in one array (at least 256 bytes, a multiple of 16). */
  bytes(): Uint8Array<ArrayBuffer> {
    const all = new Uint8Array(Math.max(256, Math.ceil(this.#size / 16) * 16));
    for (const p of this.#parts) all.set(p.bytes, p.offset);
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
