/**
 * Graceful shutdown. A {@link Drainer} wraps the handler and counts the calls in flight; on a
 * signal, {@link Drainer.drain}:
 *
 * 1. keeps serving until the event loop has been free for a settle window (100 ms of turns none
 *    longer than 50 ms, at most a quarter of the deadline), so that connections the kernel
 *    accepted while a long computation held the event loop reach the handler and are answered,
 *    not reset;
 * 2. then stops taking calls: a new request gets a 503 problem `shutting_down` with
 *    `Retry-After` and `Connection: close`;
 * 3. waits for every call it took, up to a deadline counted from the signal (uploads still in
 *    progress included: `server.shutdown()` would cut them, so it comes last);
 * 4. keeps refusing until no request has come for a quiet window (100 ms, at most
 *    {@link MAX_QUIET_WAIT_MS} in all): a client that honours `Retry-After`, or a balancer
 *    that takes the 503 as "instance down", has stopped connecting by then. Closing the port
 *    resets the connections the kernel accepted that the server has not read yet; a client
 *    cannot tell whether such a call ran, so the port closes only once they have stopped coming;
 * 5. closes the listener (`server.shutdown()`).
 * @module
 */
import { NOT_LOGGED, problem, problemResponse, toProblem } from "./problem.ts";
import { sentPath } from "./routes.ts";

/** Default wait for calls in flight after SIGTERM/SIGINT: 30 s. */
export const DEFAULT_SHUTDOWN_DEADLINE_MS = 30_000;

/** Default settle window before new calls are refused: 100 ms of a free event loop. */
export const DEFAULT_SETTLE_MS = 100;

/**
 * A second SIGINT/SIGTERM this soon after the first (ms, as the handlers see them) is the same
 * stop, not a request to exit at once: a signal to a process group reaches the server and its
 * parent, and `deno task` (or deploy/start.sh's trap) sends its copy on. Ctrl-C in a terminal,
 * systemd's `KillMode=control-group` and `kill -- -PGID` all do that. Two signals queued while a
 * computation held the event loop are handled back to back, so they count as one as well.
 */
export const SAME_STOP_MS = 500;

/** Default quiet window before the port closes: no request refused for 100 ms. */
export const DEFAULT_QUIET_MS = 100;

/**
 * The longest the drain keeps refusing while requests keep coming (a client that ignores
 * `Retry-After`), also capped by the deadline left: 2 s.
 */
export const MAX_QUIET_WAIT_MS = 2_000;

/** An event-loop turn longer than this means the loop was held (the settle window restarts). */
const HELD_TURN_MS = 50;

/** Options of {@link Drainer.drain}. */
export interface DrainOptions {
  /** Total wait from the call of drain (the signal). */
  deadlineMs: number;
  /** Keep taking calls until the loop was free this long (at most a quarter of the deadline). */
  settleMs?: number;
  /** Once drained, keep refusing until no request came for this long ({@link DEFAULT_QUIET_MS};
   * at most {@link MAX_QUIET_WAIT_MS} and the deadline left). */
  quietMs?: number;
}

/** What a drain did. */
export interface DrainResult {
  /** Every call taken finished before the deadline. */
  drained: boolean;
  /** Calls still running when the deadline passed (0 when drained). */
  unfinished: number;
  /** Milliseconds from the call of drain until it returned. */
  ms: number;
  /** Requests refused with 503 `shutting_down` during the drain. */
  refused: number;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Waits until the event loop has turned freely for `ms` (no turn over {@link HELD_TURN_MS}),
 * or `capMs` in all: I/O queued while the loop was held is then taken in.
 */
async function settle(ms: number, capMs: number): Promise<void> {
  const t0 = performance.now();
  let quietSince = t0;
  for (;;) {
    const now = performance.now();
    if (now - quietSince >= ms || now - t0 >= capMs) return;
    await sleep(5);
    if (performance.now() - now > HELD_TURN_MS) quietSince = performance.now();
  }
}

/** Resolves with `p`'s outcome, or with "deadline" after `ms`. */
async function within<T>(p: Promise<T>, ms: number): Promise<T | "deadline"> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"deadline">((r) => timer = setTimeout(() => r("deadline"), ms));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** The refusal of a call that came during the drain: expected, so not logged as a fault. */
function shuttingDown(req: Request): Response {
  const doc = toProblem(
    problem(503, "shutting_down", "the server is shutting down and takes no new calls"),
    sentPath(req),
    NOT_LOGGED,
  );
  return problemResponse(doc, { connection: "close" });
}

/** Counts the calls a handler is working on and drains them on shutdown. */
export class Drainer {
  #count = 0;
  #waiters: (() => void)[] = [];
  #refusing = false;
  #refused = 0;
  #lastRefusalAt = 0; // performance.now() of the last refusal, or of the drain's start

  /** Calls being handled now. */
  get count(): number {
    return this.#count;
  }

  /** Wraps a handler: counts each call until its response is ready; refuses when draining. */
  track<A extends unknown[]>(
    handler: (req: Request, ...rest: A) => Promise<Response>,
  ): (req: Request, ...rest: A) => Promise<Response> {
    return async (req, ...rest) => {
      if (this.#refusing) {
        this.#refused++;
        this.#lastRefusalAt = performance.now();
        await req.body?.cancel().catch(() => {});
        return shuttingDown(req);
      }
      this.#count++;
      try {
        return await handler(req, ...rest);
      } finally {
        if (--this.#count === 0) this.#waiters.splice(0).forEach((w) => w());
      }
    };
  }

  /** Resolves when no call is being handled. */
  idle(): Promise<void> {
    return this.#count === 0 ? Promise.resolve() : new Promise((r) => this.#waiters.push(r));
  }

  /**
   * Settles, stops taking calls, waits for the calls taken (or the deadline), waits for the
   * requests to stop coming, closes.
   */
  async drain(server: { shutdown(): Promise<void> }, opts: DrainOptions): Promise<DrainResult> {
    const t0 = performance.now();
    const left = () => Math.max(0, opts.deadlineMs - (performance.now() - t0));
    await settle(opts.settleMs ?? DEFAULT_SETTLE_MS, opts.deadlineMs / 4);
    this.#refusing = true;
    this.#lastRefusalAt = performance.now();
    const drained = (await within(this.idle(), left())) !== "deadline";
    const unfinished = this.#count;
    if (drained) await this.#quiet(opts.quietMs ?? DEFAULT_QUIET_MS, left());
    await within(server.shutdown(), drained ? left() : 0);
    return { drained, unfinished, ms: performance.now() - t0, refused: this.#refused };
  }

  /** Waits until no request was refused for `ms`, at most MAX_QUIET_WAIT_MS or `leftMs`. */
  async #quiet(ms: number, leftMs: number): Promise<void> {
    const until = performance.now() + Math.min(MAX_QUIET_WAIT_MS, leftMs);
    for (;;) {
      const now = performance.now();
      const wait = this.#lastRefusalAt + ms - now;
      if (wait <= 0 || now >= until) return;
      await sleep(Math.min(wait, until - now));
    }
  }
}
