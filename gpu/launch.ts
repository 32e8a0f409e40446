/**
 * The one launch path every GPU backend uses (after tinygrad): a call is a list of uploads,
 * a list of kernel dispatches bound by binding name, and a list of buffers to read back. One
 * command encoder, one compute pass per dispatch or one for them all (`timing`; timed when the
 * device has `timestamp-query`, with a pooled query set), bind groups from the device's cache
 * (gpu/bind_groups.ts), uploads by `writeBuffer` or, large ones, through mapped staging
 * buffers kept between calls (gpu/upload_staging.ts), one submit, one `mapAsync` of one pooled
 * readback buffer (read as soon as the GPU is done on Deno's runtime: gpu/map_read.ts), and
 * its bytes kept one of three ways (gpu/readback_memory.ts: Deno's own copy moved out, the
 * mapping itself lent when the caller asks, else a copy into lent host memory); the parts are
 * views of that memory, valid until the result's `release()`. The whole call
 * runs inside a validation error scope: a WebGPU validation error (a binding over a limit, a
 * bad dispatch) fails the call with a 500 `gpu_validation_error` instead of answering with
 * data the GPU never computed. An aborted signal before submit cancels the call: nothing is
 * submitted, so nothing is written.
 * @module
 */
import { trace } from "../core/trace.ts";
import { ClientClosedError, ServiceError } from "../core/errors.ts";
import type { GpuContext } from "../core/types.ts";
import type { CompiledKernel } from "./kernel.ts";
import { poolOf } from "./buffer_pool.ts";
import { type BindGroupCache, bindGroupsOf } from "./bind_groups.ts";
import { STAGED_UPLOAD_BYTES, stagedUploads, stagingOf } from "./upload_staging.ts";
import { wakeDawnPoll } from "./dawn_tick_pace.ts";
import { mapDeferredReads, mapReadRangeDeferred } from "./map_read.ts";
import { readbackMemory } from "./readback_memory.ts";
import { inErrorScopes } from "./error_scopes.ts";

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

/** The bind-group entries of a call, in the kernel's binding order. */
export function entries(call: KernelCall): { binding: number; resource: GPUBufferBinding }[] {
  return call.kernel.bindings.map((b, i) => {
    const r = call.bind[b.name];
    if (!r) throw new Error(`${call.kernel.key}: binding ${b.name} has no buffer`);
    return { binding: i, resource: "size" in r && "usage" in r ? { buffer: r } : r };
  });
}

function checkSignal(signal?: AbortSignal): void {
  if (signal?.aborted) throw new ClientClosedError("the client went away before the call ran");
}

/** A large upload written into a mapped staging buffer, copied by the call's encoder. */
interface Staged {
  from: GPUBuffer;
  to: GPUBuffer;
  offset: number;
  bytes: number;
}

/**
 * Writes the uploads: those `staged` says (in order, with the mapped buffers `froms`) into
 * their staging buffer, which is unmapped for the encoder's copy; the rest by `writeBuffer`.
 */
function writeUploads(
  dev: GPUDevice,
  uploads: LaunchSpec["uploads"],
  staged: (u: LaunchSpec["uploads"][number]) => boolean,
  froms: GPUBuffer[],
): Staged[] {
  const out: Staged[] = [];
  for (const u of uploads) {
    const n = u.data.byteLength;
    if (n === 0) continue;
    if (staged(u)) {
      const from = froms[out.length];
      new Uint8Array(from.getMappedRange(0, n)).set(u.data);
      from.unmap();
      out.push({ from, to: u.buffer, offset: u.offset ?? 0, bytes: n });
    } else dev.queue.writeBuffer(u.buffer, u.offset ?? 0, u.data as Uint8Array<ArrayBuffer>);
  }
  return out;
}

/** Records `calls` in `passes` compute passes (one each, or one for all), timed into `qs`. */
function recordCalls(
  enc: GPUCommandEncoder,
  calls: KernelCall[],
  passes: number,
  qs: GPUQuerySet | null,
  groups: BindGroupCache,
  label: string,
): void {
  const dispatch = (pass: GPUComputePassEncoder, c: KernelCall) => {
    pass.setPipeline(c.kernel.pipeline);
    pass.setBindGroup(0, c.group ?? groups.get(c.kernel.layout, entries(c), c.name));
    if (c.indirect) pass.dispatchWorkgroupsIndirect(c.indirect.buffer, c.indirect.offset);
    else if (c.grid[0] * c.grid[1] > 0) pass.dispatchWorkgroups(c.grid[0], c.grid[1]);
  };
  const begin = (i: number, name: string) =>
    enc.beginComputePass({
      label: name,
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
  if (passes === 1 && calls.length > 1) {
    const pass = begin(0, label);
    for (const c of calls) dispatch(pass, c);
    pass.end();
    return;
  }
  calls.forEach((c, i) => {
    const pass = begin(i, c.name);
    dispatch(pass, c);
    pass.end();
  });
}

/** Device milliseconds from the resolved timestamps: per call when each had a pass, and `gpu`. */
function deviceTimes(
  t: BigUint64Array,
  calls: KernelCall[],
  passes: number,
): Record<string, number> {
  const gpu: Record<string, number> = {};
  if (passes === calls.length) {
    calls.forEach((c, i) => {
      if (t[2 * i] > 0n && t[2 * i + 1] >= t[2 * i]) {
        gpu[c.name] = (gpu[c.name] ?? 0) + Number(t[2 * i + 1] - t[2 * i]) / 1e6;
      }
    });
  }
  const last = 2 * passes - 1;
  if (t[0] > 0n && t[last] >= t[0]) gpu.gpu = Number(t[last] - t[0]) / 1e6;
  return gpu;
}

/** Runs one launch (see the module doc). */
export async function launch(ctx: GpuContext, spec: LaunchSpec): Promise<LaunchResult> {
  const t0 = performance.now();
  checkSignal(spec.signal);
  const dev = ctx.device;
  // Staging buffers first: nothing may await between pushing the error scope and popping it
  // (the scope stack is the device's, shared by concurrent calls).
  // (Whether this device stages is asked only when an upload is large enough to be staged.)
  const large = (u: LaunchSpec["uploads"][number]) => u.data.byteLength >= STAGED_UPLOAD_BYTES;
  const staging = spec.uploads.some(large) && stagedUploads(ctx) ? stagingOf(ctx) : null;
  const big = (u: LaunchSpec["uploads"][number]) => staging !== null && large(u);
  const bigUploads = spec.uploads.filter(big);
  const froms = bigUploads.length === 0
    ? []
    : await Promise.all(bigUploads.map((u) => staging!.acquire(u.data.byteLength)));
  const pool = poolOf(ctx);
  const timed = ctx.features.has("timestamp-query") && spec.calls.length > 0 &&
    spec.timing !== "none";
  const passes = spec.timing === "total" || spec.timing === "none"
    ? Math.min(1, spec.calls.length)
    : spec.calls.length;
  const qs = timed ? pool.acquireQuerySet(2 * passes) : null;
  const offsets: number[] = [];
  let total = 0;
  for (const r of spec.reads) {
    offsets.push(total);
    total += Math.ceil(r.bytes / 16) * 16;
  }
  const stampAt = total;
  if (qs) total += 16 * passes;
  const mapped = Math.max(16, total); // the read-back buffer's bytes, all mapped
  const readback = pool.acquire(
    mapped,
    GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
    `${spec.label}.readback`,
  );
  const resolve = qs
    ? pool.acquire(
      16 * passes,
      GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
      `${spec.label}.stamps`,
    )
    : null;
  // Earlier calls' deferred reads first (outside this call's error scope): they need not wait
  // for this one's kernels (gpu/map_read.ts mapReadRangeDeferred).
  mapDeferredReads(dev);
  let lent = false;
  try {
    // The scope is popped right after the submit, before any await (gpu/error_scopes.ts).
    const { value: { tUp, tRec }, errors } = inErrorScopes(dev, ["validation"], () => {
      const staged = writeUploads(dev, spec.uploads, big, froms);
      const tUp = performance.now();
      const enc = dev.createCommandEncoder({ label: spec.label });
      for (const c of staged) enc.copyBufferToBuffer(c.from, 0, c.to, c.offset, c.bytes);
      recordCalls(enc, spec.calls, passes, qs, bindGroupsOf(dev), spec.label);
      spec.reads.forEach((r, i) => {
        const n = Math.ceil(r.bytes / 4) * 4;
        if (n > 0) enc.copyBufferToBuffer(r.buffer, r.offset ?? 0, readback, offsets[i], n);
      });
      if (qs && resolve) {
        enc.resolveQuerySet(qs, 0, 2 * passes, resolve, 0);
        enc.copyBufferToBuffer(resolve, 0, readback, stampAt, 16 * passes);
      }
      const cmd = enc.finish();
      checkSignal(spec.signal);
      const tRec = performance.now();
      trace(`launch ${spec.label}: submit`);
      dev.queue.submit([cmd]);
      spec.onSubmitted?.();
      return { tUp, tRec };
    });
    const t1 = performance.now();
    trace(`launch ${spec.label}: submitted`);
    wakeDawnPoll(); // a short wait: Dawn's poll unpaced again (gpu/dawn_tick_pace.ts)
    const [[error], range] = await Promise.all([
      errors,
      mapReadRangeDeferred(dev, readback, 0, mapped),
    ]);
    trace(`launch ${spec.label}: read back`);
    if (error) {
      readback.unmap();
      throw new ServiceError(`the GPU rejected the ${spec.label} call: ${error.message}`, {
        status: 500,
        code: "gpu_validation_error",
        extra: { call: spec.label },
      });
    }
    const tMap = performance.now();
    const { mem, release, lent: kept } = readbackMemory(
      dev,
      pool,
      readback,
      range,
      total,
      spec.lend === true,
    );
    lent = kept;
    if (!kept) readback.unmap();
    let parts: Uint8Array<ArrayBuffer>[], gpu: Record<string, number>;
    try {
      parts = spec.reads.map((r, i) => new Uint8Array(mem, offsets[i], r.bytes));
      gpu = qs ? deviceTimes(new BigUint64Array(mem, stampAt, 2 * passes), spec.calls, passes) : {};
    } catch (e) {
      release(); // nobody will: a lent buffer would wait for the collector
      throw e;
    }
    if (parts.length === 0) release(); // only the timestamps were read
    const t2 = performance.now();
    return {
      parts,
      release,
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
    for (const from of froms) staging!.recycle(from);
    if (!lent) pool.release(readback); // a lent one goes back at the result's release
    if (resolve) pool.release(resolve);
    if (qs) pool.releaseQuerySet(qs);
  }
}
