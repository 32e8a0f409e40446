/**
 * The device threads' liveness (`--device-threads`, device_threads.ts). A thread that throws is
 * seen at once (its error event), but one that stops without an error, its event loop ended or
 * `self.close()` called (Deno's Worker has no exit or close event, and a message posted to an
 * ended worker is dropped without a word), or whose JS thread is blocked, was not seen at all:
 * its calls waited until their clients gave up, `/metrics` (which asks every thread) too, and
 * new caches were placed on it.
 *
 * What was chosen: a liveness ping, not a per-call watchdog. Every `pingMs` (default 1,000) the
 * front posts each running thread a `device-ping` unless its last one is still unanswered; the
 * thread's message handler answers `device-pong` at once (device_thread.ts). A thread whose ping
 * stays unanswered `lostMs` (default 30,000) is lost, as a crashed one is: its calls in flight
 * and all later ones answer 503 `device_thread_lost` (retryable, with Retry-After), the loss is
 * logged once, `/metrics` leaves its series out, no cache is placed on it, its listener's calls
 * passed on end (`--device-threads-http`), and the front ends it (`terminate()`: a blocked
 * thread's caches are then gone, as the 503 says, its memory and listener with them).
 *
 * Why: a per-call deadline cannot tell a dead thread from a slow call (a long prefill, a
 * pipeline compile, a budget of seconds), and a ping costs nothing on a call's path (no message
 * per call; one small message each way per thread and `pingMs`, while idle too, so a thread
 * that ends idle is seen before a call or a cache is sent to it: within `pingMs + lostMs`). The
 * ping is answered by the thread's event loop, so it is answered while the GPU works, a
 * CPU_REFERENCE forward runs on its worker pool, or a compile is awaited; it is not while the
 * thread's JS thread runs one long synchronous task (a synchronous pipeline compile on Deno's
 * runtime, a large body decoded on the host, a Dawn stall: seconds, README's "Dawn stalls"
 * minutes before they were paced). On the 2-core dev VM (Deno's runtime, lavapipe) prefills
 * and decodes of five shapes and dtypes, each compiling its pipelines, left pings unanswered for
 * up to 3.8 s, and on Deno's runtime a call's GPU wait holds the JS thread for the whole call
 * (an 8,192-token f32 prefill on lavapipe: 10.4 s). So a thread running a call (its handler
 * counts them in shared memory, `Watched.busy`) is never lost for its silence: its silence
 * counts from when it is free again. A thread that ends or blocks while idle is found; one that
 * hangs inside a call (a device that never finishes) is found only with `stuckMs`
 * (`ATTN_THREAD_STUCK_MS`, default 0: never): a thread running calls whose count of finished
 * calls (shared memory, `Watched.finished`) has not moved for that long is lost, as a silent one
 * is. Off by default because a call may take as long as it takes (a 32,768-token prefill within
 * the default limits ran over 30 s on lavapipe); an operator who knows its longest call sets it
 * above that.
 * Losing a live thread loses its caches, while waiting longer only delays the 503 of a dead
 * one, so the default is well above the longest idle block seen (30 s) and below the minute a
 * client commonly waits. A tick of the front's timer that fires late (this thread was busy: the pongs
 * may not be read yet) judges no thread; the next does. The timer is unref'd (it keeps no
 * process alive) and stopped at close (a thread busy closing is not lost).
 *
 * Set by `ATTN_THREAD_PING_MS` (0: no watchdog, the stuck check included),
 * `ATTN_THREAD_LOST_MS` and `ATTN_THREAD_STUCK_MS` (integers of ms, at most 2^31 - 1; the lost
 * limit, and a stuck limit but 0, at least 1,000; a bad value stops the server at start-up:
 * serve_env.ts), or by the front's options (tests). A silent thread is lost between `lostMs` and
 * `lostMs + pingMs` after its last answer; a stuck one between `stuckMs` and `stuckMs + pingMs`
 * after a tick first saw it busy with no call finished since.
 * @module
 */
import { envInt, type EnvSetting, EnvValueError, readSetting } from "../core/env.ts";
import { MAX_TIMER_MS } from "../core/timeout.ts";

/** How the front watches its threads. */
export interface WatchdogOptions {
  /** How often each running thread is pinged (ms); 0: never (no watchdog). */
  pingMs: number;
  /** How long a ping may go unanswered before its thread is lost (ms). */
  lostMs: number;
  /**
   * How long a thread may run calls without finishing any before it is lost as stuck (ms); 0
   * (the default): never, a call may take as long as it takes.
   */
  stuckMs?: number;
}

/** The defaults (see the module doc for why). */
export const DEFAULT_WATCHDOG: Readonly<WatchdogOptions> = {
  pingMs: 1000,
  lostMs: 30_000,
  stuckMs: 0,
};

/** The variables that set {@link WatchdogOptions}. */
export const PING_ENV = "ATTN_THREAD_PING_MS",
  LOST_ENV = "ATTN_THREAD_LOST_MS",
  STUCK_ENV = "ATTN_THREAD_STUCK_MS";

/** {@link PING_ENV}'s rule: an integer of ms from 0 (no watchdog) to 2^31 - 1. */
export const THREAD_PING_SETTING: EnvSetting<number> = {
  name: PING_ENV,
  unset: DEFAULT_WATCHDOG.pingMs,
  parse: (text) => envInt(PING_ENV, text, 0, MAX_TIMER_MS, " (ms; 0: no watchdog)"),
};

/** The shortest lost limit the variable takes (ms): an idle thread answers well within it. */
export const MIN_LOST_MS = 1000;

/** {@link LOST_ENV}'s rule: an integer of ms from {@link MIN_LOST_MS} to 2^31 - 1. */
export const THREAD_LOST_SETTING: EnvSetting<number> = {
  name: LOST_ENV,
  unset: DEFAULT_WATCHDOG.lostMs,
  parse: (text) => envInt(LOST_ENV, text, MIN_LOST_MS, MAX_TIMER_MS, " (ms)"),
};

/** {@link STUCK_ENV}'s rule: an integer of ms, 0 (never) or {@link MIN_LOST_MS} to 2^31 - 1. */
export const THREAD_STUCK_SETTING: EnvSetting<number> = {
  name: STUCK_ENV,
  unset: DEFAULT_WATCHDOG.stuckMs!,
  parse: (text) => {
    const ms = envInt(STUCK_ENV, text, 0, MAX_TIMER_MS, " (ms; 0: never)");
    if (ms !== 0 && ms < MIN_LOST_MS) {
      throw new EnvValueError(
        STUCK_ENV,
        text,
        `${STUCK_ENV} must be 0 (never) or at least ${MIN_LOST_MS} (ms), got ${
          JSON.stringify(text)
        }`,
      );
    }
    return ms;
  },
};

/**
 * The options from {@link PING_ENV}, {@link LOST_ENV} and {@link STUCK_ENV} (checked at start-up,
 * serve_env.ts).
 * @throws EnvValueError naming the variable and its value where its rule refuses it.
 */
export function watchdogFromEnv(): WatchdogOptions {
  return {
    pingMs: readSetting(THREAD_PING_SETTING),
    lostMs: readSetting(THREAD_LOST_SETTING),
    stuckMs: readSetting(THREAD_STUCK_SETTING),
  };
}

/** What the watchdog needs of a thread (device_threads.ts `Thread`). */
export interface Watched {
  readonly index: number;
  /** Why the thread stopped, or null while it runs. */
  readonly lost: string | null;
  /** Posts ping `seq` (the thread answers with it: {@link ThreadWatchdog.pong}). */
  ping(seq: number): void;
  /**
   * Whether the thread is running a call (it counts them in shared memory): its silence is then
   * its work (on Deno's runtime a GPU wait holds the JS thread for the whole call), not its end.
   */
  busy(): boolean;
  /** How many calls the thread has finished (any outcome): it counts them in shared memory. */
  finished(): number;
  /** The thread answered no ping for `lostMs`: it is lost (`why`). */
  lose(why: string): void;
}

/** Slack past two periods before a tick counts as late (timers fire a little late anyway). */
const LATE_SLACK_MS = 50;

/** Pings `threads` every `pingMs` and loses one silent for `lostMs`; see the module doc. */
export class ThreadWatchdog {
  readonly #waiting = new Map<Watched, { seq: number; at: number }>();
  /** Per busy thread: its finished count when last seen changing, and since when. */
  readonly #progress = new Map<Watched, { finished: number; since: number }>();
  #seq = 0;
  #last = 0;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(
    private readonly threads: readonly Watched[],
    private readonly o: WatchdogOptions,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Starts the pings (none when `pingMs` is 0); the timer keeps no process alive. */
  start(): this {
    if (this.o.pingMs <= 0 || this.#timer !== undefined) return this;
    this.#last = this.now();
    const timer = setInterval(() => this.tick(), Math.min(this.o.pingMs, MAX_TIMER_MS));
    Deno.unrefTimer(timer);
    this.#timer = timer;
    return this;
  }

  /** Stops the pings (at close: a thread busy closing is not lost). */
  stop(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
    this.#waiting.clear();
    this.#progress.clear();
  }

  /** Thread `t` answered ping `seq`. */
  pong(t: Watched, seq: unknown): void {
    if (this.#waiting.get(t)?.seq === seq) this.#waiting.delete(t);
  }

  /**
   * Whether `t` has run calls for `stuckMs` without finishing one (then it is lost here): its
   * finished count, watched while it is busy, has not moved since a tick first saw it there.
   */
  #stuck(t: Watched, now: number, late: boolean): boolean {
    const limit = this.o.stuckMs ?? 0;
    if (limit <= 0 || !t.busy()) {
      this.#progress.delete(t);
      return false;
    }
    const finished = t.finished();
    const p = this.#progress.get(t);
    if (!p || p.finished !== finished) {
      this.#progress.set(t, { finished, since: now });
      return false;
    }
    if (late || now - p.since < limit) return false;
    this.#progress.delete(t);
    t.lose(
      `it ran calls for ${Math.round(now - p.since)} ms without finishing one (a call that ` +
        `never ends, e.g. a device that never finishes its work; ${STUCK_ENV}=${limit})`,
    );
    return true;
  }

  /** One period: loses the threads silent too long, pings the others not waited on. */
  tick(): void {
    const now = this.now();
    const late = now - this.#last > 2 * this.o.pingMs + LATE_SLACK_MS;
    this.#last = now;
    for (const t of this.threads) {
      const w = this.#waiting.get(t);
      if (t.lost !== null) {
        this.#waiting.delete(t);
        this.#progress.delete(t);
      } else if (this.#stuck(t, now, late)) {
        this.#waiting.delete(t);
      } else if (!w) {
        this.#waiting.set(t, { seq: ++this.#seq, at: now });
        t.ping(this.#seq);
      } else if (t.busy()) {
        // At work: its silence counts from when it is free again.
        this.#waiting.set(t, { seq: w.seq, at: now });
      } else if (!late && now - w.at >= this.o.lostMs) {
        this.#waiting.delete(t);
        t.lose(
          `it answered no ping for ${Math.round(now - w.at)} ms (its event loop ended, or its ` +
            `JS thread was blocked that long; ${LOST_ENV}=${this.o.lostMs})`,
        );
      }
    }
  }
}
