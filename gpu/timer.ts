/**
 * GPU-side pass timing with `timestamp-query`, read back with a call's single readback, so a
 * forward can report how long its kernels ran on the device (`timings.gpu_attend`) apart from
 * the host work and Deno's readback latency.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import type { BatchBuffers, ReadbackPart } from "./batch_buffers.ts";

/** Begin/end timestamps of `passes` compute passes. */
export class PassTimer {
  readonly querySet: GPUQuerySet;
  readonly passes: number;
  private constructor(querySet: GPUQuerySet, passes: number) {
    this.querySet = querySet;
    this.passes = passes;
  }

  /** A timer, or null where the device was not granted `timestamp-query`. */
  static create(ctx: GpuContext, passes = 1): PassTimer | null {
    if (!ctx.features.has("timestamp-query")) return null;
    const querySet = ctx.device.createQuerySet({ type: "timestamp", count: 2 * passes });
    return new PassTimer(querySet, passes);
  }

  /** The `timestampWrites` of pass `i`. */
  writes(i: number): GPUComputePassTimestampWrites {
    return {
      querySet: this.querySet,
      beginningOfPassWriteIndex: 2 * i,
      endOfPassWriteIndex: 2 * i + 1,
    };
  }

  /** Records the resolve; returns the readback part carrying the raw u64 timestamps. */
  resolve(encoder: GPUCommandEncoder, bufs: BatchBuffers): ReadbackPart {
    const buffer = bufs.queryResolve(16 * this.passes);
    encoder.resolveQuerySet(this.querySet, 0, 2 * this.passes, buffer, 0);
    return { buffer, floats: 4 * this.passes };
  }

  /** Milliseconds of pass `i` from the read-back part (null when the adapter wrote zeros). */
  ms(part: Float32Array, i: number): number | null {
    const t = new BigUint64Array(part.buffer, part.byteOffset, 2 * this.passes);
    const begin = t[2 * i], end = t[2 * i + 1];
    if (begin === 0n || end < begin) return null;
    return Number(end - begin) / 1e6;
  }

  destroy(): void {
    this.querySet.destroy();
  }
}

/** Host clock readings of one GPU call, in the order run() takes them (performance.now()). */
export interface CallMarks {
  /** run() starts */
  start: number;
  /** the cache write is recorded */
  written: number;
  /** the attention pass is recorded */
  attended: number;
  /** encoder.finish() returned */
  finished: number;
  /** queue.submit() returned */
  submitted: number;
  /** the readback resolved */
  read: number;
}

/** The `timings` a GPU backend reports: host phases in ms, plus the pass's device time when known. */
export function callTimings(
  plan_ms: number,
  m: CallMarks,
  gpuAttend: number | null,
): Record<string, number> {
  return {
    plan: plan_ms,
    encode: m.submitted - m.start,
    encode_write: m.written - m.start,
    encode_attend: m.attended - m.written,
    finish: m.finished - m.attended,
    submit: m.submitted - m.finished,
    gpu_and_readback: m.read - m.submitted,
    ...(gpuAttend !== null ? { gpu_attend: gpuAttend } : {}),
  };
}
