/**
 * A forward call's queue timeout: the most milliseconds the caller lets the call wait between
 * its arrival (its body read and decoded) and its start (behind earlier calls on its cache, for
 * the device), plus what its body waited between threads before that (a server's HTTP workers or
 * device threads: server/request_arrival.ts, passed as `queueSince`). A call past it is not run
 * and answers 503 `queue_timeout` ({@link QueueTimeoutError}): nothing was written, so a caller
 * that times out knows its call had no effect. In the library it is the forward option
 * `queueTimeoutMs`; over HTTP the request header `X-Attention-Queue-Timeout-Ms`
 * (server/queue_timeout_header.ts), under the same rule.
 * @module
 */
import { QueueTimeoutError, ServiceError } from "./errors.ts";
import { MAX_TIMER_MS } from "./timeout.ts";
import { shownValue } from "./shown.ts";

/** What a queue timeout must be, in the words of a refusal. */
export const QUEUE_TIMEOUT_RULE = `a number of milliseconds above 0 and at most ${MAX_TIMER_MS}`;

/** Whether `ms` is a queue timeout the service takes. */
export function isQueueTimeoutMs(ms: unknown): ms is number {
  return typeof ms === "number" && Number.isFinite(ms) && ms > 0 && ms <= MAX_TIMER_MS;
}

/**
 * The library option checked: undefined stays undefined (no bound).
 * @throws ServiceError 400 `invalid_request` naming `queueTimeoutMs` and its value.
 */
export function checkQueueTimeoutMs(ms: unknown): number | undefined {
  if (ms === undefined || isQueueTimeoutMs(ms)) return ms;
  const got = shownValue(ms);
  throw new ServiceError(`queueTimeoutMs must be ${QUEUE_TIMEOUT_RULE}; got ${got}`, {
    status: 400,
    code: "invalid_request",
    issues: [{ path: ["queueTimeoutMs"], message: `must be ${QUEUE_TIMEOUT_RULE}; got ${got}` }],
  });
}

/**
 * Where a call's queue timeout counts from: `since` (the library option `queueSince`) when it is a
 * time before `now`, else `now`.
 * @throws ServiceError 400 `invalid_request` naming `queueSince` when it is not a finite number.
 */
export function queueSinceOf(since: unknown, now: number): number {
  if (since === undefined) return now;
  if (typeof since !== "number" || !Number.isFinite(since)) {
    const got = shownValue(since);
    throw new ServiceError(
      `queueSince must be a finite number (performance.now() ms); got ${got}`,
      {
        status: 400,
        code: "invalid_request",
        issues: [{ path: ["queueSince"], message: `must be a finite number; got ${got}` }],
      },
    );
  }
  return Math.min(since, now);
}

/** A call's queue deadline, as the service hands it to a backend that queues calls itself. */
export interface QueueDeadline {
  /** The caller's timeout, ms. */
  timeoutMs: number;
  /** When the wait began (`performance.now()`); the deadline is `since + timeoutMs`. */
  since: number;
}

/** The 503 of a call whose deadline `d` passed before it started (`now`: when that was seen). */
export function queueTimeoutError(d: QueueDeadline, now = performance.now()): QueueTimeoutError {
  return new QueueTimeoutError(d.timeoutMs, now - d.since);
}

/** Whether deadline `d` has passed at `now`. */
export function pastDeadline(d: QueueDeadline, now = performance.now()): boolean {
  return now - d.since > d.timeoutMs;
}

/**
 * Calls `fn(now)` once deadline `d` has passed (by {@link pastDeadline}: a timer that fires a
 * little early, as Deno's did by 0.4 ms of 5, is set again for the rest); returns a function that
 * cancels it.
 */
export function atDeadline(d: QueueDeadline, fn: (now: number) => void): () => void {
  let timer: ReturnType<typeof setTimeout>;
  const fire = () => {
    const now = performance.now();
    if (pastDeadline(d, now)) return fn(now);
    timer = setTimeout(fire, Math.max(1, Math.ceil(d.since + d.timeoutMs - now)));
  };
  timer = setTimeout(fire, Math.max(0, d.since + d.timeoutMs - performance.now()));
  return () => clearTimeout(timer);
}

/**
 * A call's start under its queue timeout, decided once: the call claims it when it starts
 * ({@link claim}), or the timeout takes it first, and then the call must do nothing. While the call
 * waits for its cache, {@link race} answers the 503 as soon as the timeout passes (not when the
 * cache frees); the call, reaching its turn later, fails its claim and writes nothing.
 */
export class StartGate implements QueueDeadline {
  #state: "waiting" | "started" | "expired" = "waiting";
  constructor(readonly timeoutMs: number, readonly since: number) {}

  /**
   * Marks the call started.
   * @throws QueueTimeoutError when the timeout passed first (the call must then do nothing).
   */
  claim(now = performance.now()): void {
    if (this.#state === "waiting" && pastDeadline(this, now)) this.#state = "expired";
    if (this.#state === "expired") throw queueTimeoutError(this, now);
    this.#state = "started";
  }

  /**
   * `work` (a call that claims this gate when it starts), or a QueueTimeoutError as soon as the
   * timeout passes while the call has not started; `work`'s later failure is then dropped.
   */
  race<T>(work: Promise<T>): Promise<T> {
    if (this.#state !== "waiting") return work;
    return new Promise<T>((resolve, reject) => {
      const cancel = atDeadline(this, (now) => {
        if (this.#state !== "waiting") return;
        this.#state = "expired";
        reject(queueTimeoutError(this, now));
      });
      work.then((v) => {
        cancel();
        resolve(v);
      }, (e) => {
        cancel();
        reject(e);
      });
    });
  }
}
