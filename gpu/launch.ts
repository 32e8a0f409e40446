/**
 * The one launch path every GPU backend uses (after tinygrad): a call is a list of uploads,
 * a list of kernel dispatches bound by binding name, and a list of buffers to read back. One
 * command encoder, one compute pass per dispatch (each timed when the device has
 * `timestamp-query`, with a pooled query set), bind groups from the device's cache
 * (gpu/bind_groups.ts), one submit, one `mapAsync` of one pooled staging buffer and one copy of
 * each part out of it. The whole call
 * runs inside a validation error scope: a WebGPU validation error (a binding over a limit, a
 * bad dispatch) fails the call with a 500 `gpu_validation_error` instead of answering with
 * data the GPU never computed. An aborted signal before submit cancels the call: nothing is
 * submitted, so nothing is written.
 * @module
 */
import { ClientClosedError, ServiceError } from "../core/errors.ts";
import type { GpuContext } from "../core/types.ts";
import type { CompiledKernel } from "./kernel.ts";
import { poolOf } from "./buffer_pool.ts";
import { bindGroupsOf } from "./bind_groups.ts";

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
  calls: KernelCall[];
  reads: ReadPart[];
  signal?: AbortSignal;
}

/** What a launch returns: the parts read back (fresh copies) and device times. */
export interface LaunchResult {
  parts: Uint8Array[];
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

function entries(call: KernelCall): { binding: number; resource: GPUBufferBinding }[] {
  return call.kernel.bindings.map((b, i) => {
    const r = call.bind[b.name];
    if (!r) throw new Error(`${call.kernel.key}: binding ${b.name} has no buffer`);
    return { binding: i, resource: "size" in r && "usage" in r ? { buffer: r } : r };
  });
}

function checkSignal(signal?: AbortSignal): void {
  if (signal?.aborted) throw new ClientClosedError("the client went away before the call ran");
}

/** Runs one launch (see the module doc). */
export async function launch(ctx: GpuContext, spec: LaunchSpec): Promise<LaunchResult> {
  const t0 = performance.now();
  checkSignal(spec.signal);
  const dev = ctx.device;
  const pool = poolOf(ctx);
  const groups = bindGroupsOf(dev);
  const timed = ctx.features.has("timestamp-query") && spec.calls.length > 0;
  const qs = timed ? pool.acquireQuerySet(2 * spec.calls.length) : null;
  const offsets: number[] = [];
  let total = 0;
  for (const r of spec.reads) {
    offsets.push(total);
    total += Math.ceil(r.bytes / 16) * 16;
  }
  const stampAt = total;
  if (qs) total += 16 * spec.calls.length;
  const staging = pool.acquire(
    Math.max(16, total),
    GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    `${spec.label}.readback`,
  );
  const resolve = qs
    ? pool.acquire(
      16 * spec.calls.length,
      GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
      `${spec.label}.stamps`,
    )
    : null;
  dev.pushErrorScope("validation");
  let scoped = true;
  try {
    for (const u of spec.uploads) {
      if (u.data.byteLength > 0) {
        dev.queue.writeBuffer(u.buffer, u.offset ?? 0, u.data as Uint8Array<ArrayBuffer>);
      }
    }
    const tUp = performance.now();
    const enc = dev.createCommandEncoder({ label: spec.label });
    spec.calls.forEach((c, i) => {
      const pass = enc.beginComputePass({
        label: c.name,
        ...(qs
          ? {
            timestampWrites: {
              querySet: qs,
              beginningOfPassWriteIndex: 2 * i,
              endOfPassWriteIndex: 2 * i + 1,
            },
          }
          : {}),
      });
      pass.setPipeline(c.kernel.pipeline);
      pass.setBindGroup(0, groups.get(c.kernel.layout, entries(c), c.name));
      if (c.grid[0] * c.grid[1] > 0) pass.dispatchWorkgroups(c.grid[0], c.grid[1]);
      pass.end();
    });
    spec.reads.forEach((r, i) => {
      const n = Math.ceil(r.bytes / 4) * 4;
      if (n > 0) enc.copyBufferToBuffer(r.buffer, r.offset ?? 0, staging, offsets[i], n);
    });
    if (qs && resolve) {
      enc.resolveQuerySet(qs, 0, 2 * spec.calls.length, resolve, 0);
      enc.copyBufferToBuffer(resolve, 0, staging, stampAt, 16 * spec.calls.length);
    }
    const cmd = enc.finish();
    checkSignal(spec.signal);
    const tRec = performance.now();
    dev.queue.submit([cmd]);
    const t1 = performance.now();
    const errorPromise = dev.popErrorScope();
    scoped = false;
    const [error] = await Promise.all([errorPromise, staging.mapAsync(GPUMapMode.READ)]);
    if (error) {
      staging.unmap();
      throw new ServiceError(`the GPU rejected the ${spec.label} call: ${error.message}`, {
        status: 500,
        code: "gpu_validation_error",
        extra: { call: spec.label },
      });
    }
    const tMap = performance.now();
    const mapped = staging.getMappedRange();
    const parts = spec.reads.map((r, i) =>
      new Uint8Array(mapped.slice(offsets[i], offsets[i] + r.bytes))
    );
    const gpu: Record<string, number> = {};
    if (qs) {
      const t = new BigUint64Array(mapped.slice(stampAt, stampAt + 16 * spec.calls.length));
      spec.calls.forEach((c, i) => {
        if (t[2 * i] > 0n && t[2 * i + 1] >= t[2 * i]) {
          gpu[c.name] = (gpu[c.name] ?? 0) + Number(t[2 * i + 1] - t[2 * i]) / 1e6;
        }
      });
      const last = 2 * spec.calls.length - 1;
      if (t[0] > 0n && t[last] >= t[0]) gpu.gpu = Number(t[last] - t[0]) / 1e6;
    }
    staging.unmap();
    const t2 = performance.now();
    return {
      parts,
      gpu,
      host: {
        encode: t1 - t0,
        wait: t2 - t1,
        upload: tUp - t0,
        record: tRec - tUp,
        submit: t1 - tRec,
        map: tMap - t1,
        copy: t2 - tMap,
      },
    };
  } finally {
    if (scoped) await dev.popErrorScope().catch(() => null);
    pool.release(staging);
    if (resolve) pool.release(resolve);
    if (qs) pool.releaseQuerySet(qs);
  }
}
