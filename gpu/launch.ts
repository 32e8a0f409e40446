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
 *
 * Its parts live beside it: the types of a launch and its result (gpu/launch_types.ts) and
 * what it records into the command encoder (gpu/launch_encode.ts); their exports are
 * re-exported here.
 * @module
 */
import { trace } from "../core/trace.ts";
import { ClientClosedError, ServiceError } from "../core/errors.ts";
import type { GpuContext } from "../core/types.ts";
import { type BufferPool, poolOf } from "./buffer_pool.ts";
import { bindGroupsOf } from "./bind_groups.ts";
import { STAGED_UPLOAD_BYTES, stagedUploads, stagingOf } from "./upload_staging.ts";
import { wakeDawnPoll } from "./dawn_tick_pace.ts";
import { mapDeferredReads, mapReadRangeDeferred } from "./map_read.ts";
import { readbackMemory } from "./readback_memory.ts";
import { inErrorScopes } from "./error_scopes.ts";
import type { LaunchResult, LaunchSpec } from "./launch_types.ts";
import { deviceTimes, recordCalls, writeUploads } from "./launch_encode.ts";

export type { Bound, KernelCall, LaunchResult, LaunchSpec, ReadPart } from "./launch_types.ts";
export { entries } from "./launch_encode.ts";

function checkSignal(signal?: AbortSignal): void {
  if (signal?.aborted) throw new ClientClosedError("the client went away before the call ran");
}

/** Where each read part and the timestamps lie in the read-back buffer, and its bytes. */
interface ReadbackLayout {
  offsets: number[];
  stampAt: number;
  /** Bytes the parts and timestamps fill. */
  total: number;
  /** The read-back buffer's bytes, all mapped. */
  mapped: number;
}

function readbackLayout(reads: LaunchSpec["reads"], stampPasses: number): ReadbackLayout {
  const offsets: number[] = [];
  let total = 0;
  for (const r of reads) {
    offsets.push(total);
    total += Math.ceil(r.bytes / 16) * 16;
  }
  const stampAt = total;
  total += 16 * stampPasses;
  return { offsets, stampAt, total, mapped: Math.max(16, total) };
}

/** The pooled buffers of one launch: read-back, and the query set and resolve buffer if timed. */
interface LaunchBuffers {
  readback: GPUBuffer;
  qs: GPUQuerySet | null;
  resolve: GPUBuffer | null;
}

/** The pooled buffers of a launch reading back `mapped` bytes, timed in `timedPasses` passes. */
function launchBuffers(
  pool: BufferPool,
  label: string,
  mapped: number,
  timedPasses: number,
): LaunchBuffers {
  const timed = timedPasses > 0;
  return {
    qs: timed ? pool.acquireQuerySet(2 * timedPasses) : null,
    readback: pool.acquire(
      mapped,
      GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      `${label}.readback`,
    ),
    resolve: timed
      ? pool.acquire(
        16 * timedPasses,
        GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
        `${label}.stamps`,
      )
      : null,
  };
}

/**
 * Records the launch into one command encoder and submits it (inside the caller's error
 * scope): staged copies, clears, calls, the copies into the read-back buffer, the timestamps.
 * Returns when the uploads were written and when recording ended.
 */
function encodeAndSubmit(
  dev: GPUDevice,
  spec: LaunchSpec,
  staged: (u: LaunchSpec["uploads"][number]) => boolean,
  froms: GPUBuffer[],
  passes: number,
  b: LaunchBuffers,
  at: ReadbackLayout,
): { tUp: number; tRec: number } {
  const copies = writeUploads(dev, spec.uploads, staged, froms);
  const tUp = performance.now();
  const enc = dev.createCommandEncoder({ label: spec.label });
  for (const c of copies) enc.copyBufferToBuffer(c.from, 0, c.to, c.offset, c.bytes);
  if (spec.clears) { for (const buf of spec.clears) enc.clearBuffer(buf); }
  recordCalls(enc, spec.calls, passes, b.qs, bindGroupsOf(dev), spec.label);
  spec.reads.forEach((r, i) => {
    const n = Math.ceil(r.bytes / 4) * 4;
    if (n > 0) enc.copyBufferToBuffer(r.buffer, r.offset ?? 0, b.readback, at.offsets[i], n);
  });
  if (b.qs && b.resolve) {
    enc.resolveQuerySet(b.qs, 0, 2 * passes, b.resolve, 0);
    enc.copyBufferToBuffer(b.resolve, 0, b.readback, at.stampAt, 16 * passes);
  }
  const cmd = enc.finish();
  checkSignal(spec.signal);
  const tRec = performance.now();
  trace(`launch ${spec.label}: submit`);
  dev.queue.submit([cmd]);
  spec.onSubmitted?.();
  return { tUp, tRec };
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
  const stampPasses = timed ? passes : 0;
  const at = readbackLayout(spec.reads, stampPasses);
  const b = launchBuffers(pool, spec.label, at.mapped, stampPasses);
  // Earlier calls' deferred reads first (outside this call's error scope): they need not wait
  // for this one's kernels (gpu/map_read.ts mapReadRangeDeferred).
  mapDeferredReads(dev);
  let lent = false;
  try {
    // The scope is popped right after the submit, before any await (gpu/error_scopes.ts).
    const { value: { tUp, tRec }, errors } = inErrorScopes(
      dev,
      ["validation"],
      () => encodeAndSubmit(dev, spec, big, froms, passes, b, at),
    );
    const t1 = performance.now();
    trace(`launch ${spec.label}: submitted`);
    wakeDawnPoll(); // a short wait: Dawn's poll unpaced again (gpu/dawn_tick_pace.ts)
    const [[error], range] = await Promise.all([
      errors,
      mapReadRangeDeferred(dev, b.readback, 0, at.mapped),
    ]);
    trace(`launch ${spec.label}: read back`);
    if (error) {
      b.readback.unmap();
      throw new ServiceError(`the GPU rejected the ${spec.label} call: ${error.message}`, {
        status: 500,
        code: "gpu_validation_error",
        extra: { call: spec.label },
      });
    }
    const tMap = performance.now();
    const kept = readbackMemory(dev, pool, b.readback, range, at.total, spec.lend === true);
    lent = kept.lent;
    if (!lent) b.readback.unmap();
    const { parts, gpu } = resultParts(kept, spec, passes, b.qs !== null, at);
    const t2 = performance.now();
    return {
      parts,
      release: kept.release,
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
    if (!lent) pool.release(b.readback); // a lent one goes back at the result's release
    if (b.resolve) pool.release(b.resolve);
    if (b.qs) pool.releaseQuerySet(b.qs);
  }
}

/** The read parts as views of the kept memory, and the device times from its timestamps. */
function resultParts(
  kept: { mem: ArrayBuffer; release: () => void },
  spec: LaunchSpec,
  passes: number,
  timed: boolean,
  at: ReadbackLayout,
): { parts: Uint8Array<ArrayBuffer>[]; gpu: Record<string, number> } {
  let parts: Uint8Array<ArrayBuffer>[], gpu: Record<string, number>;
  try {
    parts = spec.reads.map((r, i) => new Uint8Array(kept.mem, at.offsets[i], r.bytes));
    gpu = timed
      ? deviceTimes(new BigUint64Array(kept.mem, at.stampAt, 2 * passes), spec.calls, passes)
      : {};
  } catch (e) {
    kept.release(); // nobody will: a lent buffer would wait for the collector
    throw e;
  }
  if (parts.length === 0) kept.release(); // only the timestamps were read
  return { parts, gpu };
}
