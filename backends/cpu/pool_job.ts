/**
 * One call of the CPU worker pool (backends/cpu/pool.ts), from enqueue to settle: its message
 * to a worker ({@link callRequest}), the {@link Job} the pool queues ({@link newJob}), its abort
 * and queue-timeout listeners ({@link watchJob}), what its worker's replies do to it
 * ({@link applyReply}), how it leaves the queue unrun ({@link unqueue}) and settles once
 * ({@link settle}), and how the rows its write overwrote are put back when it does not complete
 * ({@link undoJob}).
 * @module
 */
import { atDeadline, type QueueDeadline, queueTimeoutError } from "../../core/queue_timeout.ts";
import type { ForwardBatch } from "../../core/types.ts";
import type { HostKvCache } from "./host_cache.ts";
import {
  type CallReply,
  type CallRequest,
  cancelledError,
  fromWire,
  toWireBatch,
  WRITING,
  WRITTEN,
} from "./protocol.ts";
import type { Slot } from "./pool_workers.ts";
import { restoreRows } from "./undo.ts";

/** What a worker computed: the output in float32 (values of the batch dtype), LSE, timings. */
export interface HostResult {
  output: Float32Array;
  lse: Float32Array | null;
  timings?: Record<string, number>;
}

/** One call, from enqueue to settle. */
export interface Job {
  request: CallRequest;
  batch: ForwardBatch;
  cache: HostKvCache | null;
  control: Int32Array;
  undo: Uint8Array | null;
  enqueued: number;
  started: number;
  settled: boolean;
  /** The signal aborted while the worker was writing: stop it once the write is complete. */
  stopWhenWritten: boolean;
  /** Its queue timeout: still queued then, it leaves the queue unrun. */
  deadline?: QueueDeadline;
  resolve(r: HostResult): void;
  reject(e: unknown): void;
  detach(): void;
}

/**
 * The message of call `id`: the batch without its cache, the cache's handle (null: the call
 * reads no cache), a fresh control word and an undo buffer of `undo` bytes (none when 0).
 */
export function callRequest(
  id: number,
  batch: ForwardBatch,
  cache: HostKvCache | null,
  undo: number,
): CallRequest {
  return {
    id,
    batch: toWireBatch(batch),
    cache: cache ? cache.handle() : null,
    control: new SharedArrayBuffer(4),
    undo: undo > 0 ? new SharedArrayBuffer(undo) : null,
  };
}

/** The job of `request` (enqueued now), settled through `resolve` / `reject`. */
export function newJob(
  request: CallRequest,
  batch: ForwardBatch,
  cache: HostKvCache | null,
  resolve: (r: HostResult) => void,
  reject: (e: unknown) => void,
): Job {
  return {
    request,
    batch,
    cache,
    control: new Int32Array(request.control),
    undo: request.undo ? new Uint8Array(request.undo) : null,
    enqueued: performance.now(),
    started: 0,
    settled: false,
    stopWhenWritten: false,
    resolve,
    reject,
    detach: () => {},
  };
}

/**
 * Arms a job's listeners: `signal` aborting calls `onAbort`; at `deadline` (its queue timeout),
 * `onTimeout` takes the queue-timeout error. The job's `detach()` removes both.
 */
export function watchJob(
  job: Job,
  signal: AbortSignal | undefined,
  deadline: QueueDeadline | undefined,
  onAbort: () => void,
  onTimeout: (error: Error) => void,
): void {
  if (signal) {
    signal.addEventListener("abort", onAbort, { once: true });
    job.detach = () => signal.removeEventListener("abort", onAbort);
  }
  if (deadline) {
    job.deadline = deadline;
    const cancel = atDeadline(
      deadline,
      (now) => onTimeout(queueTimeoutError(deadline, now)),
    );
    const detach = job.detach;
    job.detach = () => {
      cancel();
      detach();
    };
  }
}

/**
 * A worker's reply to the call its slot runs (any other is ignored): `written` calls
 * `stopWritten` when the signal aborted during the write; `done`, `failed` (its write undone)
 * and `cancelled` settle the call and free the slot. True when the slot was freed.
 */
export function applyReply(slot: Slot, r: CallReply, stopWritten: () => void): boolean {
  slot.answered = true;
  const job = slot.job;
  if (!job || job.request.id !== r.id) return false;
  switch (r.kind) {
    case "written":
      if (job.stopWhenWritten) stopWritten();
      return false;
    case "done":
      slot.job = null;
      settle(job, {
        output: r.output,
        lse: r.lse,
        timings: { queue: job.started - job.enqueued, ...r.timings },
      });
      break;
    case "failed":
      undoJob(job);
      slot.job = null;
      settle(job, fromWire(r.error));
      break;
    case "cancelled":
      slot.job = null;
      settle(job, cancelledError());
      break;
  }
  return true;
}

/** Takes a call out of `queue`, settled with `error`; false when it is not queued. */
export function unqueue(queue: Job[], job: Job, error: Error): boolean {
  const q = job.settled ? -1 : queue.indexOf(job);
  if (q < 0) return false;
  queue.splice(q, 1);
  settle(job, error);
  return true;
}

/** Puts back the rows a call overwrote, when its write began. */
export function undoJob(job: Job): void {
  const state = Atomics.load(job.control, 0);
  if ((state === WRITING || state === WRITTEN) && job.undo && job.cache) {
    restoreRows(job.batch, job.cache, job.undo);
  }
}

/** Settles the job with `outcome` (a result, or the error it rejects with); once only. */
export function settle(job: Job, outcome: HostResult | Error): void {
  if (job.settled) return;
  job.settled = true;
  job.detach();
  if (outcome instanceof Error) job.reject(outcome);
  else job.resolve(outcome);
}
