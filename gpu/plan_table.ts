/**
 * A plan's immutable GPU data in one buffer, uploaded with one write: every kernel's `Params`
 * block and every metadata table (tiles, block table, slot mapping, slopes, sinks), each
 * section at a 256-byte aligned offset (the offset alignment WebGPU guarantees for uniform and
 * storage bindings). Built once per plan, shared read-only by every call that reuses the plan,
 * destroyed when the plan cache drops the plan.
 * @module
 */
import type { GpuContext } from "../core/types.ts";

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

  /** Creates the buffer and writes every section with one `writeBuffer`. */
  upload(ctx: GpuContext, label: string): PlanTable {
    const size = Math.max(256, Math.ceil(this.#size / 16) * 16);
    const all = new Uint8Array(size);
    for (const p of this.#parts) all.set(p.bytes, p.offset);
    const buffer = ctx.device.createBuffer({
      label,
      size,
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
    });
    ctx.device.queue.writeBuffer(buffer, 0, all);
    return { buffer, bind: (s) => ({ buffer, offset: s.offset, size: s.size }) };
  }
}
