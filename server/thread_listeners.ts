/**
 * The main thread's side of `--device-threads-http` (device_threads.ts, thread_http.ts): it
 * binds the port with `reusePort` (so port 0 is one port for every thread), tells each device
 * thread to serve it too, and closes its own hold once all listen, so the kernel spreads
 * connections over the threads only. Each thread passes what is not its own to this thread
 * through a MessageChannel of its own, where a RequestOwner runs the front's handler on it
 * (request_owner.ts), as for an HTTP worker. A thread that stops (a crash, or silence to the
 * front's ping: thread_watchdog.ts) takes its clients' connections with it: the calls it passed
 * here end at once, a body still to come failing with a 503 `device_thread_lost` (else the front
 * would wait for it without end), and the answers go to no one. Each thread counts the calls
 * its listener is working on in memory shared with this thread (`calls`), read at a signal
 * (main.ts). On shutdown each thread drains its listener (shutdown.ts) and says what was left
 * unfinished. The listeners together are an HttpServer (worker_front.ts), as main.ts serves with
 * otherwise: `shutdown` drains them (or waits for the drain under way) and `finished` settles
 * once every listener is closed.
 * @module
 */
import type { HttpListenerMessage, HttpListenMessage } from "./device_thread.ts";
import { type ErrorLogger, problem } from "./problem.ts";
import { RequestOwner } from "./request_owner.ts";
import { DEFAULT_SHUTDOWN_DEADLINE_MS } from "./shutdown.ts";
import { MAX_TIMER_MS } from "../core/timeout.ts";
import type { HttpServer } from "./worker_front.ts";
import { checkFromWorker } from "./worker_protocol.ts";

/** What this needs of a device thread (device_threads.ts `Thread`). */
export interface ListeningThread {
  readonly index: number;
  readonly worker: Worker;
  readonly lost: string | null;
  /** Resolves with why once the thread stops (a crash, or silence); pending while it runs. */
  readonly stopped: Promise<string>;
  /**
   * `[0]`: the calls its listener is working on now (the thread counts them, device_thread.ts;
   * shared memory, so a read here costs no message).
   */
  readonly calls: Int32Array;
  /** Resolves with the thread's next listener message. */
  nextListenerMessage(): Promise<HttpListenerMessage>;
}

/** What the threads' drains did, summed over the threads. */
export interface ThreadsDrained {
  drained: boolean;
  unfinished: number;
  /** Requests the threads refused with 503 `shutting_down` while draining. */
  refused: number;
  /**
   * Threads that had not answered the drain by its deadline plus {@link THREAD_DRAIN_GRACE_MS}
   * (a thread whose event loop is stuck): not drained, their calls uncounted.
   */
  silent: number;
}

/**
 * How long past a drain's deadline the front waits for a thread's answer before counting it
 * silent, so that a stuck thread cannot hold the process's shutdown past its deadline.
 */
export const THREAD_DRAIN_GRACE_MS = 2000;

/**
 * The threads' listeners, once all listen. `shutdown()` is a drain with the default deadline
 * (DEFAULT_SHUTDOWN_DEADLINE_MS) unless one is under way; `finished` resolves once it is done.
 */
export interface ThreadListeners extends HttpServer {
  /**
   * Drains every running thread's listener within `deadlineMs` (each settles, refuses new
   * calls, waits for its calls, closes); sums what was left. Only the first drain (or
   * shutdown) asks the threads: a later call gets its result.
   */
  drain(deadlineMs: number): Promise<ThreadsDrained>;
  /** The calls the running threads' listeners are working on now (a lost thread's are gone). */
  inFlight(): number;
}

/** The problem a call passed on by thread `index` ends with once the thread stopped (`why`). */
function passedOnLost(index: number, why: string): Error {
  return problem(
    503,
    "device_thread_lost",
    `device thread ${index} stopped: ${why}; a call it took and passed on ends here ` +
      `(its client's connection went with the thread)`,
    { device_thread: index },
  );
}

/**
 * The front's end of thread `t`'s channel: messages to the owner, answers posted back. Once the
 * thread stops, the calls it passed on end (RequestOwner.failAll, a 503) and the channel closes.
 */
function frontEnd(
  t: ListeningThread,
  port: MessagePort,
  handler: (r: Request) => Promise<Response>,
  log: ErrorLogger,
) {
  const owner = new RequestOwner((m, tr) => port.postMessage(m, tr), handler, log);
  let gone = false;
  void t.stopped.then((why) => {
    gone = true;
    port.close();
    const n = owner.size;
    if (n > 0) {
      const what = `${n} calls it passed on in flight: they end with a 503 device_thread_lost`;
      log(`device thread ${t.index} stopped with ${what}, answered to no one`, undefined);
    }
    owner.failAll(passedOnLost(t.index, why));
  });
  port.onmessage = (e) => {
    if (gone) return; // posted before the thread stopped, delivered after: no client to answer
    const m = checkFromWorker(e.data);
    if (typeof m === "string") {
      log("a device thread's listener sent a malformed message", new Error(m));
      const id = (e.data as { id?: unknown } | null)?.id;
      if (typeof id === "number" && (e.data as { type?: unknown }).type === "head") {
        owner.malformed(id, m);
      }
      return;
    }
    if (m.type === "head") owner.head(m);
    else if (m.type === "body") owner.body(m);
    else if (m.type === "abort") owner.abort(m.id);
  };
  return owner;
}

/**
 * Makes every thread serve `port` on `hostname` (0: a free one), passing the rest to `handler`
 * here. Rejects with the first thread's reason when one cannot listen (the others keep their
 * listeners until the process exits: main.ts exits then).
 */
export async function listenOnThreads(
  threads: readonly ListeningThread[],
  o: {
    port: number;
    hostname: string;
    token: string;
    handler: (req: Request) => Promise<Response>;
    log: ErrorLogger;
  },
): Promise<ThreadListeners> {
  const hold = Deno.listen({ port: o.port, hostname: o.hostname, reusePort: true });
  const port = (hold.addr as Deno.NetAddr).port;
  try {
    const answers = await Promise.all(threads.map((t) => {
      const channel = new MessageChannel();
      frontEnd(t, channel.port1, o.handler, o.log);
      const answer = t.nextListenerMessage();
      const m: HttpListenMessage = {
        type: "http-listen",
        port,
        hostname: o.hostname,
        token: o.token,
        front: channel.port2,
        calls: t.calls,
      };
      t.worker.postMessage(m, [channel.port2]);
      return answer;
    }));
    const bad = answers.findIndex((a) => a.type !== "http-listening");
    if (bad >= 0) {
      const a = answers[bad];
      const why = a.type === "http-failed" ? a.reason : a.type;
      throw new Error(`device thread ${threads[bad].index} cannot listen: ${why}`);
    }
    const first = answers[0] as Extract<HttpListenerMessage, { type: "http-listening" }>;
    return threadListeners(threads, { hostname: first.hostname, port: first.port });
  } finally {
    hold.close();
  }
}

/** Tells every running thread to drain its listener; sums their answers. */
async function drainThreads(
  threads: readonly ListeningThread[],
  deadlineMs: number,
  graceMs: number,
): Promise<ThreadsDrained> {
  const timers: ReturnType<typeof setTimeout>[] = [];
  const silence = () =>
    new Promise<"silent">((r) =>
      // At most setTimeout's longest timer (a longer one fires at once), which the deadline may be.
      timers.push(setTimeout(() => r("silent"), Math.min(MAX_TIMER_MS, deadlineMs + graceMs)))
    );
  const done = await Promise.all(threads.map((t) => {
    if (t.lost !== null) return Promise.resolve(null);
    const answer = t.nextListenerMessage();
    t.worker.postMessage({ type: "http-drain", deadlineMs });
    return Promise.race([answer, silence()]);
  }));
  timers.forEach(clearTimeout);
  let drained = true, unfinished = 0, refused = 0, silent = 0;
  for (const d of done) {
    if (d === "silent") {
      drained = false;
      silent++;
    }
    if (d === "silent" || d?.type !== "http-drained") continue; // lost: its listener went with it
    drained &&= d.drained;
    unfinished += d.unfinished;
    refused += d.refused;
  }
  return { drained, unfinished, refused, silent };
}

/**
 * The listeners of `threads` on `addr`, as one server (see {@link ThreadListeners}); a thread
 * silent `graceMs` past a drain's deadline counts as not drained.
 */
export function threadListeners(
  threads: readonly ListeningThread[],
  addr: { hostname: string; port: number },
  graceMs = THREAD_DRAIN_GRACE_MS,
): ThreadListeners {
  const closed = Promise.withResolvers<void>();
  let draining: Promise<ThreadsDrained> | null = null;
  const drain = (deadlineMs: number) =>
    draining ??= drainThreads(threads, deadlineMs, graceMs).finally(() => closed.resolve());
  return {
    addr,
    finished: closed.promise,
    drain,
    inFlight: () =>
      threads.reduce((n, t) => n + (t.lost === null ? Atomics.load(t.calls, 0) : 0), 0),
    async shutdown() {
      await drain(DEFAULT_SHUTDOWN_DEADLINE_MS);
    },
  };
}
