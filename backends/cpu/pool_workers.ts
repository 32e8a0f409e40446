/**
 * The workers of the CPU worker pool (backends/cpu/pool.ts): how many it may start
 * ({@link defaultPoolSize}, {@link CpuPoolOptions}) and keeps started on a device thread
 * ({@link DEVICE_THREAD_WARM_WORKERS}), a worker and the call it runs ({@link Slot}), starting
 * one with its message handlers ({@link spawnSlot}), and terminating the idle ones beyond those
 * kept warm ({@link terminateIdle}).
 * @module
 */
import type { ServiceError } from "../../core/errors.ts";
import { type CallReply, crashedError } from "./protocol.ts";
import type { Job } from "./pool_job.ts";

/** Options of `CpuWorkerPool` (backends/cpu/pool.ts). */
export interface CpuPoolOptions {
  /** Most workers at once (default {@link defaultPoolSize}). */
  size?: number;
  /** The worker module (default backends/cpu/worker.ts); tests pass faulty ones. */
  workerUrl?: URL;
  /** Milliseconds a worker may sit idle before it is terminated (default 10,000). */
  idleMs?: number;
}

/**
 * The workers a device thread keeps started (`CpuWorkerPool.keepWarm`): on Deno 2.9.6 a
 * worker started from inside a worker takes about 1 s to answer its first call (one thread:
 * about 30 ms), which the first CPU_REFERENCE call after each idle-out paid (bench/NOTES.md v0.20).
 */
export const DEVICE_THREAD_WARM_WORKERS = 1;

/** cores - 1 (one core stays with the event loop), at least 1, at most 8. */
export function defaultPoolSize(cores: number = navigator.hardwareConcurrency): number {
  return Math.max(1, Math.min(8, Math.floor(cores || 1) - 1));
}

/** A worker and the call it runs (null: idle). */
export interface Slot {
  worker: Worker;
  job: Job | null;
  /** It has answered something (a `warm` reply, a call's): it loaded and runs. */
  answered?: boolean;
}

/**
 * Starts a worker of module `url` (`new Worker` blocks the event loop): its replies go to
 * `onReply`; an uncaught error or an unreadable reply to `onCrash`, as 500 `cpu_worker_crashed`.
 */
export function spawnSlot(
  url: URL,
  onReply: (slot: Slot, r: CallReply) => void,
  onCrash: (slot: Slot, err: ServiceError) => void,
): Slot {
  const slot: Slot = { worker: new Worker(url, { type: "module" }), job: null };
  slot.worker.onmessage = (e: MessageEvent<CallReply>) => onReply(slot, e.data);
  slot.worker.onerror = (e: ErrorEvent) => {
    e.preventDefault();
    onCrash(slot, crashedError(e.message || "uncaught error"));
  };
  slot.worker.onmessageerror = () => onCrash(slot, crashedError("unreadable reply"));
  return slot;
}

/** Terminates the idle workers of `slots` beyond `keep` live ones, taking them out of `slots`. */
export function terminateIdle(slots: Slot[], keep: number): void {
  const idle = slots.filter((s) => !s.job);
  for (const s of idle.slice(0, Math.max(0, slots.length - keep))) {
    slots.splice(slots.indexOf(s), 1);
    s.worker.terminate();
  }
}
