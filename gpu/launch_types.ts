/**
 * What a launch (gpu/launch.ts) is given and what it gives back: the buffer bindings, the
 * kernel dispatches, the ranges to read back, the launch spec and its result.
 * @module
 */
import type { CompiledKernel } from "./kernel.ts";

/** A buffer binding: a whole buffer or a range of one. */
export type Bound = GPUBuffer | { buffer: GPUBuffer; offset?: number; size?: number };

/** One dispatch. */
export interface KernelCall {
  /** Names the pass in timings (`gpu_<name>`). */
  name: string;
  kernel: CompiledKernel;
  /** A buffer for every binding the kernel declares, by the binding's name. */
  bind: Record<string, Bound>;
  /** Workgroups (x, y); nothing is dispatched when x * y is 0. */
  grid: readonly [number, number];
  /** Dispatch indirectly: the workgroup counts are the three u32 at `offset` of `buffer`. */
  indirect?: { buffer: GPUBuffer; offset: number };
  /** The bind group of `bind`, when the caller resolved it already (gpu/gpu_plan.ts). */
  group?: GPUBindGroup;
}

/** One buffer range to read back. */
export interface ReadPart {
  buffer: GPUBuffer;
  bytes: number;
  offset?: number;
}

/** One launch. */
export interface LaunchSpec {
  label: string;
  /** queue.writeBuffer calls made before encoding (data length a multiple of 4). */
  uploads: { buffer: GPUBuffer; data: Uint8Array; offset?: number }[];
  /**
   * Buffers the command encoder zeroes (`clearBuffer`) before the calls: no staging and no
   * queue write, unlike an upload of zeros. Each needs COPY_DST usage.
   */
  clears?: GPUBuffer[];
  calls: KernelCall[];
  reads: ReadPart[];
  signal?: AbortSignal;
  /** Called right after the submit (see core/types.ts RunOptions). */
  onSubmitted?: () => void;
  /**
   * The parts may be the mapped read-back buffer itself, held until `release()`, where the
   * runtime's mapped range is the mapping (Dawn): no copy, and the caller releases the result
   * once it no longer reads them (gpu/readback_memory.ts). Otherwise they are a copy.
   */
  lend?: boolean;
  /**
   * `calls` (the default): one compute pass per call, each timed (`gpu.<name>`, and `gpu.gpu`
   * from the first begin to the last end). `total`: every call in one compute pass (the device
   * orders the dispatches and makes each one's writes visible to the next), timed as a whole
   * (`gpu.gpu` only): fewer passes to encode, and no timestamps between the dispatches.
   * `none`: one pass, untimed (no query set, resolve or copy of timestamps: on Dawn over
   * lavapipe those cost about 35 us of host time a call).
   */
  timing?: "calls" | "total" | "none";
}

/**
 * What a launch returns: the parts read back and device times. The parts are views of one
 * piece of memory (gpu/readback_memory.ts); `release()` gives it back once nothing reads them.
 */
export interface LaunchResult {
  parts: Uint8Array<ArrayBuffer>[];
  /**
   * Returns the parts' memory (to the host pool; Deno's copy freed; a lent mapping unmapped
   * and its buffer pooled), after which the parts must not be read; idempotent; not calling it
   * is safe (a lent buffer then waits for the collector).
   */
  release(): void;
  /** Device milliseconds per call name, and `gpu` for first begin to last end. */
  gpu: Record<string, number>;
  /**
   * Host milliseconds: encode (uploads + encoding + submit), wait (submit to data); and their
   * parts: upload (writeBuffer calls), record (encoding), submit, map (submit to the mapped
   * readback) and copy (the read-back parts taken out of the mapped range).
   */
  host: {
    encode: number;
    wait: number;
    upload: number;
    record: number;
    submit: number;
    map: number;
    copy: number;
  };
}
