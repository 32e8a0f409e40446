/**
 * A pool of Web Workers that runs CPU_REFERENCE calls off the event loop, so the server keeps
 * answering (`/healthz` among others) while a long host computation runs.
 *
 * - **Size**: {@link defaultPoolSize} workers at most (cores - 1, at least 1, at most 8).
 *   Workers start lazily on demand and are reused; a call waits in a FIFO queue while all are
 *   busy. Starting a worker blocks the event loop (Deno's `new Worker` is synchronous, about
 *   30 ms on the 2-core CPU machine), so at most one starts per task. Workers idle for
 *   `idleMs` (default 10 s) are terminated, so an idle pool holds no thread and does not keep
 *   the process alive for longer than that; {@link CpuWorkerPool.keepWarm} keeps some started
 *   (device threads, where a worker's start is slow).
 * - **Memory**: the cache is not copied: the worker reads and writes its SharedArrayBuffers in
 *   place. The batch's tensors are copied to the worker; output and lse are transferred back.
 * - **Ordering**: the pool orders nothing itself. Calls on one server-held cache are
 *   serialised by that cache's mutex (service/cache_store.ts); calls on different caches run
 *   in parallel on different workers.
 * - **Atomic writes**: a call that does not resolve with a result leaves its cache exactly as
 *   it was. The worker saves every row it will overwrite before its first write
 *   (backends/cpu/undo.ts), and the pool puts them back when the call fails, is cancelled
 *   after its write began, or its worker crashes.
 * - **Cancellation** (`signal`): a queued call leaves the queue; a call whose worker has not
 *   begun writing is cancelled through the shared control word and writes nothing; a call
 *   whose write has begun finishes the write (a write is never interrupted), then its worker
 *   is stopped and the write undone. Either way the call rejects with 499
 *   `client_closed_request` ("Client Closed Request", nginx's status for a client that went
 *   away; never a 5xx, as the server did nothing wrong) and the cache is unchanged.
 * - **Crashes**: a worker that dies (an uncaught error, a reply that cannot be read) is
 *   dropped, its call rejects with 500 `cpu_worker_crashed` (cache restored), and the next call
 *   starts a fresh worker. An error a call throws comes back as the same ServiceError (e.g. 422
 *   `invalid_batch`); any other error as 500 `cpu_worker_failed`.
 * - **close()** refuses queued and new calls (503 `cpu_pool_closed`), waits for the running
 *   ones, and terminates every worker. The pool stays usable: a later call starts new workers.
 * @module
 */
import { ServiceError } from "../../core/errors.ts";
import { pastDeadline, type QueueDeadline, queueTimeoutError } from "../../core/queue_timeout.ts";
import type { HostKvCache } from "./host_cache.ts";
import type { ForwardBatch } from "../../core/types.ts";
import {
  type CallReply,
  type CallRequest,
  CANCELLED,
  cancelledError,
  closedError,
  crashedError,
  PENDING,
  type WarmRequest,
  WRITING,
} from "./protocol.ts";
import { undoBytes } from "./undo.ts";
import {
  applyReply,
  callRequest,
  type HostResult,
  type Job,
  newJob,
  settle,
  undoJob,
  unqueue,
  watchJob,
} from "./pool_job.ts";
import {
  type CpuPoolOptions,
  defaultPoolSize,
  DEVICE_THREAD_WARM_WORKERS,
  type Slot,
  spawnSlot,
  terminateIdle,
} from "./pool_workers.ts";

export { type CpuPoolOptions, defaultPoolSize, DEVICE_THREAD_WARM_WORKERS, type HostResult };

/** Runs CPU_REFERENCE calls on a bounded set of reusable Web Workers. */
export class CpuWorkerPool {
  /** Most workers at once. */
  readonly size: number;
  readonly #url: URL;
  readonly #idleMs: number;
  #slots: Slot[] = [];
  #queue: Job[] = [];
  #nextId = 1;
  #closing = false;
  #idleTimer: ReturnType<typeof setTimeout> | undefined;
  #pumpTimer: ReturnType<typeof setTimeout> | undefined;
  /** A worker was started in the current task; the next one waits for #pumpTimer. */
  #spawnedThisTask = false;
  #drainWaiters: (() => void)[] = [];
  /** Workers the idle-out leaves started ({@link keepWarm}). */
  #warm = 0;

  constructor(opts: CpuPoolOptions = {}) {
    this.size = opts.size ?? defaultPoolSize();
    if (!Number.isInteger(this.size) || this.size < 1) {
      throw new RangeError(`pool size must be a positive integer, got ${this.size}`);
    }
    this.#url = opts.workerUrl ?? new URL("./worker.ts", import.meta.url);
    this.#idleMs = opts.idleMs ?? 10_000;
  }

  /** Live workers. */
  get workers(): number {
    return this.#slots.length;
  }

  /**
   * Keeps `n` workers (at most the pool's size) started: one is started now, with no call
   * waiting, so that it has loaded its module before the first call comes, the idle-out
   * terminates only the idle workers beyond `n`, and one that ends (a crash, a call stopped
   * after its write) is replaced. 0: the default, every idle worker goes. close() sets it
   * back to 0.
   */
  keepWarm(n: number): void {
    if (!Number.isInteger(n) || n < 0) {
      throw new RangeError(`keepWarm takes an integer >= 0, got ${n}`);
    }
    this.#warm = Math.min(n, this.size);
    this.#rewarm();
  }

  /** Starts a worker (and sends it its first message) while fewer than {@link keepWarm} live. */
  #rewarm(): void {
    if (this.#slots.length >= this.#warm || this.#closing) return;
    const warm: WarmRequest = { warm: true }; // its ~500 ms first message, paid now
    try {
      this.#spawn().worker.postMessage(warm);
    } catch { /* the next call starts one, and says why when it cannot */ }
  }

  /** Workers running a call. */
  get busy(): number {
    return this.#slots.filter((s) => s.job).length;
  }

  /** Calls waiting for a worker. */
  get queued(): number {
    return this.#queue.length;
  }

  /**
   * Runs one checked batch (plan already ran) on `cache` (null: the call reads no cache). A call
   * still queued at its `deadline` (a queue timeout) leaves the queue unrun.
   * @throws ServiceError: the call's own errors; 499 `client_closed_request`; 500
   * `cpu_worker_crashed` / `cpu_worker_failed`; 503 `cpu_pool_closed`, `queue_timeout`; 409
   * `cache_destroyed`.
   */
  run(
    batch: ForwardBatch,
    cache: HostKvCache | null,
    signal?: AbortSignal,
    deadline?: QueueDeadline,
  ): Promise<HostResult> {
    if (signal?.aborted) return Promise.reject(cancelledError());
    if (deadline && pastDeadline(deadline)) return Promise.reject(queueTimeoutError(deadline));
    if (this.#closing) return Promise.reject(closedError());
    let request: CallRequest;
    try {
      const undo = undoBytes(batch, cache);
      request = callRequest(this.#nextId++, batch, cache, undo);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      const job = newJob(request, batch, cache, resolve, reject);
      watchJob(job, signal, deadline, () => this.#abort(job), (e) => unqueue(this.#queue, job, e));
      this.#queue.push(job);
      this.#pump();
    });
  }

  /** Refuses queued and new calls, waits for running ones, terminates every worker. */
  async close(): Promise<void> {
    this.#closing = true;
    this.#warm = 0;
    try {
      for (const job of this.#queue.splice(0)) settle(job, closedError());
      clearTimeout(this.#pumpTimer);
      this.#pumpTimer = undefined;
      this.#spawnedThisTask = false;
      while (this.#slots.some((s) => s.job)) {
        await new Promise<void>((r) => this.#drainWaiters.push(r));
      }
      for (const s of this.#slots.splice(0)) s.worker.terminate();
      clearTimeout(this.#idleTimer);
      this.#idleTimer = undefined;
    } finally {
      this.#closing = false;
    }
  }

  /**
   * Starts queued calls on idle workers, spawning at most one worker per task: `new Worker`
   * blocks the event loop for tens of ms, so a burst must not start eight in one go.
   */
  #pump(): void {
    while (this.#queue.length > 0) {
      let slot = this.#slots.find((s) => !s.job);
      if (!slot) {
        if (this.#slots.length >= this.size || this.#spawnedThisTask) return;
        try {
          slot = this.#spawn();
        } catch (e) {
          settle(this.#queue.shift()!, crashedError(`no worker could be started: ${e}`));
          continue;
        }
        this.#spawnedThisTask = true;
        this.#pumpTimer = setTimeout(() => {
          this.#pumpTimer = undefined;
          this.#spawnedThisTask = false;
          this.#pump();
        }, 0);
      }
      const job = this.#queue.shift()!;
      // Its deadline's timer may not have run yet: a call past it never starts.
      if (job.deadline && pastDeadline(job.deadline)) {
        settle(job, queueTimeoutError(job.deadline));
        continue;
      }
      this.#dispatch(slot, job);
    }
  }

  #spawn(): Slot {
    const slot = spawnSlot(this.#url, (s, r) => this.#onReply(s, r), (s, e) => this.#stop(s, e));
    this.#slots.push(slot);
    return slot;
  }

  #dispatch(slot: Slot, job: Job): void {
    clearTimeout(this.#idleTimer);
    this.#idleTimer = undefined;
    slot.job = job;
    job.started = performance.now();
    try {
      slot.worker.postMessage(job.request);
    } catch (e) {
      slot.job = null;
      settle(
        job,
        new ServiceError(`the call could not be posted to a CPU worker: ${e}`, {
          status: 500,
          code: "cpu_worker_failed",
        }),
      );
      this.#released();
    }
  }

  #onReply(slot: Slot, r: CallReply): void {
    if (applyReply(slot, r, () => this.#stop(slot, cancelledError()))) this.#released();
  }

  /** The signal aborted. */
  #abort(job: Job): void {
    if (job.settled) return;
    if (unqueue(this.#queue, job, cancelledError())) return;
    const before = Atomics.compareExchange(job.control, 0, PENDING, CANCELLED);
    // PENDING: the worker will write nothing; it answers `cancelled` and is free again then.
    if (before === PENDING) return settle(job, cancelledError());
    const slot = this.#slots.find((s) => s.job === job);
    if (!slot) return;
    if (before === WRITING) job.stopWhenWritten = true;
    else this.#stop(slot, cancelledError()); // WRITTEN: attending only reads the cache
  }

  /** Terminates a slot's worker (crashed, or stopped after its write); undoes its call. */
  #stop(slot: Slot, err: ServiceError): void {
    const i = this.#slots.indexOf(slot);
    if (i < 0) return;
    // One that ended before it ever answered (its module cannot load) is not replaced in a loop:
    // keeping warm stops, and the next call starts a worker and says why it failed.
    if (!slot.answered) this.#warm = 0;
    this.#slots.splice(i, 1);
    slot.worker.terminate();
    const job = slot.job;
    slot.job = null;
    if (job) {
      undoJob(job);
      settle(job, err);
    }
    this.#released();
  }

  /** A worker became free (or went away): start queued calls; wake close(); arm the idle timer. */
  #released(): void {
    this.#pump();
    this.#rewarm(); // a warm worker that ended (#stop) is replaced
    if (this.#slots.some((s) => s.job)) return;
    for (const wake of this.#drainWaiters.splice(0)) wake();
    if (this.#slots.length === 0 || this.#idleTimer !== undefined) return;
    if (this.#slots.length <= this.#warm) return;
    const timer = setTimeout(() => {
      this.#idleTimer = undefined;
      terminateIdle(this.#slots, this.#warm);
    }, this.#idleMs);
    Deno.unrefTimer(timer);
    this.#idleTimer = timer;
  }
}
