/**
 * One device thread as the front sees it (device_threads.ts): its worker, the sender of the
 * calls it answers (request_sender.ts), its start and close, its listener's messages
 * (thread_listeners.ts), its liveness (thread_watchdog.ts), and what follows once it stops.
 * A thread stops when it throws (its error event) or when the watchdog finds it silent (it
 * ended without an error, or its JS thread is blocked: then it is ended here too); either way
 * its calls in flight and all later ones answer a 503 `device_thread_lost` (logged once, at the
 * stop), it counts as lost for placement, `/metrics` and the listeners, and its close is done.
 * @module
 */
import type { DeviceReadyMessage, DeviceThreadInit, HttpListenerMessage } from "./device_thread.ts";
import { type ErrorLogger, NOT_LOGGED, problem, problemResponse, toProblem } from "./problem.ts";
import { RequestSender } from "./request_sender.ts";
import type { ListeningThread } from "./thread_listeners.ts";
import type { ThreadWatchdog, Watched } from "./thread_watchdog.ts";

/** How a test makes a thread fail: `throw` (an error event), `exit` (ends without one), `hang`. */
export type ThreadFault = "throw" | "exit" | { hangMs: number };

/** One device thread as the front sees it; see the module doc. */
export class Thread implements ListeningThread, Watched {
  readonly worker: Worker;
  readonly sender: RequestSender;
  readonly ready = Promise.withResolvers<DeviceReadyMessage>();
  readonly closed = Promise.withResolvers<void>();
  lost: string | null = null;
  readonly #stopped = Promise.withResolvers<string>();
  /** Resolves with why once the thread stops (a crash, silence); pending while it runs. */
  readonly stopped = this.#stopped.promise;
  /**
   * `[0]`: the calls its listener is working on (`--device-threads-http`; it counts them), `[1]`:
   * those it finished (device_thread.ts `counted` keeps both, as for `working`).
   */
  readonly calls = new Int32Array(new SharedArrayBuffer(8));
  /** Caches placed here (cache_placement.ts). */
  caches = 0;
  /** The watchdog its pongs go to (set once every thread started). */
  watchdog: ThreadWatchdog | null = null;
  /** Waiters for the thread's listener messages (thread_listeners.ts), in order. */
  readonly #listenerWaits: ((m: HttpListenerMessage) => void)[] = [];

  /**
   * `[0]`: the calls the thread's handler is running, `[1]`: those it has finished (it counts
   * them: device_thread.ts).
   */
  readonly working: Int32Array;

  constructor(
    readonly index: number,
    init: DeviceThreadInit,
    maxBody: number,
    allowed: (r: Request) => boolean,
    private readonly log: ErrorLogger,
  ) {
    this.working = init.working;
    this.worker = new Worker(new URL("./device_thread.ts", import.meta.url), { type: "module" });
    this.sender = new RequestSender(
      (m, t) => this.worker.postMessage(m, t ?? []),
      maxBody,
      allowed,
      init.maxJsonBodyBytes,
    );
    this.worker.onmessage = (e) => this.#receive(e.data);
    this.worker.onerror = (e) => {
      e.preventDefault();
      this.#stop(e.message, e.error);
    };
    this.worker.postMessage(init);
  }

  #receive(data: unknown): void {
    const type = (data as { type?: unknown } | null)?.type;
    if (type === "device-pong") return this.watchdog?.pong(this, (data as { seq?: unknown }).seq);
    if (type === "device-ready") return this.ready.resolve(data as DeviceReadyMessage);
    if (type === "device-closed") return this.closed.resolve();
    if (type === "http-listening" || type === "http-failed" || type === "http-drained") {
      return this.#listenerWaits.shift()?.(data as HttpListenerMessage);
    }
    const wrong = this.sender.receive(data);
    if (wrong !== null) this.log(`device thread ${this.index}: ${wrong}`, new Error(wrong));
  }

  /** The thread stopped (`why`): logged once; every wait on it ends. */
  #stop(why: string, error: unknown): void {
    if (this.lost !== null) return;
    this.lost = why;
    this.log(`device thread ${this.index} stopped: ${why}`, error);
    this.ready.resolve({ type: "device-ready", ok: false, reason: why, fatal: false });
    this.sender.failAll(this.#lostProblem());
    this.closed.resolve();
    const failed = { type: "http-failed" as const, reason: `the thread stopped: ${why}` };
    this.#listenerWaits.splice(0).forEach((w) => w(failed));
    this.#stopped.resolve(why);
  }

  /** Watchdog: whether its handler is running a call now. */
  busy(): boolean {
    return Atomics.load(this.working, 0) > 0;
  }

  /** Watchdog: how many calls its handler has finished. */
  finished(): number {
    return Atomics.load(this.working, 1);
  }

  /** Watchdog: posts ping `seq`. */
  ping(seq: number): void {
    this.worker.postMessage({ type: "device-ping", seq });
  }

  /** Watchdog: the thread is silent (`why`): lost as a crashed one, and ended. */
  lose(why: string): void {
    this.#stop(why, undefined);
    this.worker.terminate();
  }

  /** Test hook: makes the thread fail as `how` says (device_thread.ts `control`). */
  fault(how: ThreadFault): void {
    const m = typeof how === "object"
      ? { type: "device-hang", ms: how.hangMs }
      : { type: how === "exit" ? "device-exit" : "device-fault" };
    this.worker.postMessage(m);
  }

  nextListenerMessage(): Promise<HttpListenerMessage> {
    if (this.lost !== null) {
      return Promise.resolve({ type: "http-failed", reason: `the thread stopped: ${this.lost}` });
    }
    return new Promise((r) => this.#listenerWaits.push(r));
  }

  /** The 503 of a call this thread cannot answer any more. */
  #lostProblem() {
    return problem(
      503,
      "device_thread_lost",
      `device thread ${this.index} stopped: ${this.lost}; its caches are gone`,
    );
  }

  send(
    req: Request,
    body?: Parameters<RequestSender["send"]>[1],
    extraHeaders?: [string, string][],
  ): Promise<Response> {
    if (this.lost === null) return this.sender.send(req, body, extraHeaders);
    // Logged once, at the stop.
    return Promise.resolve(problemResponse(toProblem(this.#lostProblem(), undefined, NOT_LOGGED)));
  }
}
