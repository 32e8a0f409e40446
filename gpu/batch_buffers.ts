/**
 * Per-call GPU buffers: uploads (q/k/v, metadata, uniforms) through `queue.writeBuffer`
 * (mappedAtCreation writes straight into driver-mapped memory, which on the H200 ran at tens
 * of MB/s: 1.4 s to upload one 4096-token prefill), output
 * buffers poisoned with NaN so an unwritten element shows, and a single readback of several
 * outputs through one MAP_READ staging buffer. Everything a call creates is destroyed with
 * {@link BatchBuffers.destroy}; calls share nothing, so several can be in flight.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { wakeDawnPoll } from "./dawn_tick_pace.ts";

/** The quiet-NaN f32 bit pattern outputs are poisoned with. */
export const POISON_BITS = 0x7fc00000;

const MIN_BYTES = 16;

function padded(bytes: number): number {
  return Math.max(MIN_BYTES, Math.ceil(bytes / 16) * 16);
}

/** A shared all-NaN source for poisoning, grown on demand (never written after filling). */
let poisonSource: Uint32Array<ArrayBuffer> = new Uint32Array(0);
function poisonWords(n: number): Uint32Array<ArrayBuffer> {
  if (poisonSource.length < n) {
    poisonSource = new Uint32Array(Math.max(n, poisonSource.length * 2));
    poisonSource.fill(POISON_BITS);
  }
  return poisonSource.subarray(0, n);
}

/** `data` as bytes whose length is a multiple of 4 (writeBuffer's rule), copying only if needed. */
function wordBytes(data: ArrayBufferView): Uint8Array<ArrayBuffer> {
  const src = new Uint8Array(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength);
  if (src.byteLength % 4 === 0) return src;
  const out = new Uint8Array(Math.ceil(src.byteLength / 4) * 4);
  out.set(src);
  return out;
}

/** Builds a uniform block of 4-byte fields (u32 / i32 / f32), padded to 16 bytes. */
export class UniformBuilder {
  #words: number[] = [];
  #kinds: ("u32" | "i32" | "f32")[] = [];
  /** Appends a u32. */
  u32(v: number): this {
    this.#words.push(v >>> 0);
    this.#kinds.push("u32");
    return this;
  }
  /** Appends an i32. */
  i32(v: number): this {
    this.#words.push(v | 0);
    this.#kinds.push("i32");
    return this;
  }
  /** Appends an f32. */
  f32(v: number): this {
    this.#words.push(v);
    this.#kinds.push("f32");
    return this;
  }
  /** The packed bytes (length a multiple of 16). */
  bytes(): Uint8Array<ArrayBuffer> {
    const n = Math.ceil(Math.max(1, this.#words.length) / 4) * 4;
    const buf = new ArrayBuffer(n * 4);
    const dv = new DataView(buf);
    this.#words.forEach((w, i) => {
      const k = this.#kinds[i];
      if (k === "f32") dv.setFloat32(4 * i, w, true);
      else if (k === "i32") dv.setInt32(4 * i, w, true);
      else dv.setUint32(4 * i, w, true);
    });
    return new Uint8Array(buf);
  }
}

/**
 * Workgroup counts for `workgroups` 1-D workgroups, folded into x and y when over the
 * per-dimension limit. Kernels recover the linear id as `wg.x + wg.y * num_workgroups.x`
 * and must skip ids >= the real count.
 */
export function dispatchSize(ctx: GpuContext, workgroups: number): [number, number] {
  const max = ctx.limits.maxComputeWorkgroupsPerDimension ?? 65535;
  if (workgroups <= max) return [Math.max(1, workgroups), 1];
  const y = Math.ceil(workgroups / max);
  return [Math.ceil(workgroups / y), y];
}

/** One output to read back: its buffer and how many f32 to read. */
export interface ReadbackPart {
  buffer: GPUBuffer;
  floats: number;
}

/** The buffers of one call. */
export class BatchBuffers {
  readonly ctx: GpuContext;
  readonly label: string;
  #owned: GPUBuffer[] = [];

  constructor(ctx: GpuContext, label = "batch") {
    this.ctx = ctx;
    this.label = label;
  }

  #make(size: number, usage: number, label: string, mapped: boolean): GPUBuffer {
    const b = this.ctx.device.createBuffer({
      label: `${this.label}.${label}`,
      size: padded(size),
      usage,
      mappedAtCreation: mapped,
    });
    this.#owned.push(b);
    return b;
  }

  /** A STORAGE | COPY_DST buffer holding `data` (padded to 16 bytes; at least 16). */
  storage(data: ArrayBufferView, label = "storage"): GPUBuffer {
    const b = this.#make(
      data.byteLength,
      GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
      label,
      false,
    );
    if (data.byteLength > 0) this.ctx.device.queue.writeBuffer(b, 0, wordBytes(data));
    return b;
  }

  /** A UNIFORM buffer holding `data` (a {@link UniformBuilder} or raw bytes). */
  uniform(data: UniformBuilder | ArrayBufferView, label = "uniform"): GPUBuffer {
    const bytes = data instanceof UniformBuilder ? data.bytes() : data;
    const b = this.#make(
      bytes.byteLength,
      GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      label,
      false,
    );
    if (bytes.byteLength > 0) this.ctx.device.queue.writeBuffer(b, 0, wordBytes(bytes));
    return b;
  }

  /** A STORAGE | COPY_SRC buffer of `floats` f32, every one NaN (POISON_BITS). */
  poisoned(floats: number, label = "output"): GPUBuffer {
    const b = this.#make(
      floats * 4,
      GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
      label,
      false,
    );
    if (floats > 0) this.ctx.device.queue.writeBuffer(b, 0, poisonWords(floats));
    return b;
  }

  /** A QUERY_RESOLVE | COPY_SRC buffer for resolved timestamps. */
  queryResolve(bytes: number, label = "timestamps"): GPUBuffer {
    return this.#make(bytes, GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC, label, false);
  }

  /** A STORAGE buffer of `bytes` zeros (scratch). */
  scratch(bytes: number, label = "scratch"): GPUBuffer {
    return this.#make(bytes, GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC, label, false);
  }

  /**
   * Records copies of `parts` into one MAP_READ staging buffer on `encoder`. Submit the
   * encoder, then call the returned function: one mapAsync, the parts as Float32Arrays.
   */
  readback(encoder: GPUCommandEncoder, parts: ReadbackPart[]): () => Promise<Float32Array[]> {
    const offsets: number[] = [];
    let total = 0;
    for (const p of parts) {
      offsets.push(total);
      total += Math.ceil((p.floats * 4) / 16) * 16;
    }
    const staging = this.#make(
      total,
      GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      "readback",
      false,
    );
    parts.forEach((p, i) => {
      const n = Math.ceil((p.floats * 4) / 4) * 4;
      if (n > 0) encoder.copyBufferToBuffer(p.buffer, 0, staging, offsets[i], n);
    });
    return async () => {
      wakeDawnPoll();
      await staging.mapAsync(GPUMapMode.READ);
      const all = staging.getMappedRange();
      const out = parts.map((p, i) =>
        new Float32Array(all.slice(offsets[i], offsets[i] + p.floats * 4))
      );
      staging.unmap();
      return out;
    };
  }

  /** Destroys every buffer this call created (idempotent). */
  destroy(): void {
    for (const b of this.#owned) b.destroy();
    this.#owned = [];
  }
}
