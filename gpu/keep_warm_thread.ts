/**
 * Keep-warm's `worker` mode, the serving side: starts gpu/keep_warm_worker.ts with its own Dawn
 * device and stamps each use of the serving device into shared memory (one atomic store, and a
 * wake-up only when the worker sleeps). Nothing else runs on the serving thread: no timer, no
 * submit, no wait (the `timer` mode's ticks cost that thread ~0.3 ms a call over HTTP, bench/NOTES.md
 * v0.9). Dawn need not be the serving runtime: the clock it holds up is the card's.
 * @module
 */
import { bindingDecls } from "./kernel.ts";
import { KEEP_WARM } from "./keep_warm_options.ts";
import { WARM_WORDS, type WarmWorkerInit, type WarmWorkerReply } from "./keep_warm_worker.ts";

/** How long {@link WarmThread.start} waits for the worker's device and first spin. */
export const WARM_THREAD_START_MS = 60_000;

/** What the worker spins and how. */
export interface WarmThreadOptions {
  flags: readonly string[];
  spin_iters: number;
  workgroups: number;
  depth: number;
  period_ms: number;
  hold_ms: number;
}

const now = (origin: number) => performance.timeOrigin + performance.now() - origin;

/** A running spinner thread (module doc). */
export class WarmThread {
  readonly #worker: Worker;
  readonly #words: Int32Array;
  readonly #origin: number;
  readonly #closed: Promise<void>;
  /** The first spin's wall time in the worker (ms), and the worker's adapter. */
  readonly spin_ms: number;
  readonly adapter: string;

  private constructor(
    worker: Worker,
    words: Int32Array,
    origin: number,
    ready: { spin_ms: number; adapter: string },
    closed: Promise<void>,
  ) {
    this.#worker = worker;
    this.#words = words;
    this.#origin = origin;
    this.spin_ms = ready.spin_ms;
    this.adapter = ready.adapter;
    this.#closed = closed;
  }

  /** Starts the worker; resolves with the thread, or with why it cannot run (never throws). */
  static async start(o: WarmThreadOptions, timeout_ms = WARM_THREAD_START_MS) {
    const origin = performance.timeOrigin + performance.now();
    const shared = new SharedArrayBuffer(4 * WARM_WORDS.length);
    const words = new Int32Array(shared);
    words[WARM_WORDS.stamp] = -0x80000000; // never used: idle
    const worker = new Worker(new URL("./keep_warm_worker.ts", import.meta.url).href, {
      type: "module",
    });
    let settle!: (r: WarmWorkerReply | { error: string }) => void;
    const first = new Promise<WarmWorkerReply | { error: string }>((r) => settle = r);
    let closedNow!: () => void;
    const closed = new Promise<void>((r) => closedNow = r);
    worker.onmessage = (e: MessageEvent<WarmWorkerReply>) => {
      if ("closed" in e.data) closedNow();
      else settle(e.data);
    };
    worker.onerror = (e) => {
      e.preventDefault();
      settle({ error: e.message });
      closedNow();
    };
    const init: WarmWorkerInit = {
      flags: [...o.flags],
      wgsl: `${bindingDecls(KEEP_WARM.bindings({ iters: o.spin_iters }))}\n${
        KEEP_WARM.source({ iters: o.spin_iters })
      }`,
      workgroups: o.workgroups,
      depth: o.depth,
      period_ms: o.period_ms,
      hold_ms: o.hold_ms,
      origin,
      shared,
    };
    worker.postMessage(init);
    const timer = setTimeout(
      () => settle({ error: `no spin within ${timeout_ms} ms of the worker's start` }),
      timeout_ms,
    );
    const r = await first;
    clearTimeout(timer);
    if (!("ready" in r)) {
      worker.terminate();
      return `the keep-warm worker cannot spin: ${"error" in r ? r.error : "no answer"}`;
    }
    return new WarmThread(worker, words, origin, r, closed);
  }

  /** Stamps a use of the serving device (the worker spins for `hold_ms` after it). */
  touch(): void {
    Atomics.store(this.#words, WARM_WORDS.stamp, Math.floor(now(this.#origin)));
    if (Atomics.load(this.#words, WARM_WORDS.sleeping) !== 0) {
      Atomics.notify(this.#words, WARM_WORDS.stamp);
    }
  }

  /** Spin dispatches the worker submitted so far. */
  get dispatches(): number {
    return Atomics.load(this.#words, WARM_WORDS.dispatches);
  }

  /** Whether the worker is spinning now (not asleep, not closed). */
  get spinning(): boolean {
    return Atomics.load(this.#words, WARM_WORDS.sleeping) === 0 &&
      Atomics.load(this.#words, WARM_WORDS.closed) === 0;
  }

  /** Asks the worker to stop; resolves once it has destroyed its device (or after 5 s). */
  async close(): Promise<void> {
    Atomics.store(this.#words, WARM_WORDS.closed, 1);
    Atomics.notify(this.#words, WARM_WORDS.stamp);
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([this.#closed, new Promise((r) => timer = setTimeout(r, 5000))]);
    clearTimeout(timer);
    this.#worker.terminate();
  }
}
