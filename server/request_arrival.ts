/**
 * How long a request's body waited between threads: a thread that passes a body on (an HTTP
 * worker, a device thread's listener, the device-threads front) stamps the message with the wall
 * clock (worker_protocol.ts BodyMessage `sentAt`, and `waitedMs`, what earlier hops waited), and
 * the thread that takes it measures the hop when its event loop reads the message. A forward's
 * queue timeout counts that wait ({@link waitedBetweenThreads}): on Deno's runtime a device thread
 * waiting for its GPU (up to a whole call) reads no message meanwhile, and a call held up that way
 * had waited past its timeout unseen. Reading and decoding the body are not waits, on one thread
 * or several: only the hops count.
 *
 * The clock is `Date.now()`, read at each end: the threads of a process read the same wall clock,
 * where each isolate's `performance.timeOrigin` is fixed when it starts (a clock step between two
 * starts would skew every hop after it). Read at whole milliseconds at both ends, a hop's
 * difference is within 1 ms of what it took; 1 ms is taken off, so a hop counts at most what it
 * took and up to 2 ms less. A step of the wall clock during a hop counts that hop wrong (one
 * backwards counts 0).
 * @module
 */

/** The stamp for a body posted now. */
export function hopStamp(): number {
  return Date.now();
}

/**
 * The wait of a body received now that was posted at `sentAt` after waiting `before` ms on
 * earlier hops (undefined fields: none).
 */
export function receivedWait(sentAt: number | undefined, before: number | undefined): number {
  const hop = sentAt === undefined ? 0 : Math.max(0, Date.now() - sentAt - 1);
  return (before ?? 0) + hop;
}

const waits = new WeakMap<Request, number>();

/** Records what a rebuilt request's body waited between threads. */
export function keepWait(req: Request, ms: number): void {
  if (ms > 0) waits.set(req, ms);
}

/** The ms `req`'s body waited between threads before this one read it (0: none, or read here). */
export function waitedBetweenThreads(req: Request): number {
  return waits.get(req) ?? 0;
}

const reads = new WeakMap<Request, number>();

/** Records how long threads before this one spent reading a rebuilt request's body. */
export function keepRead(req: Request, ms: number): void {
  if (ms > 0) reads.set(req, ms);
}

/**
 * The ms threads before this one spent reading `req`'s body before passing it on (0: none, or
 * read here): a forward's `Server-Timing: parse` counts it, so that a body read by the
 * device-threads front (to find its cache) is timed as one read on one thread is.
 */
export function readElsewhere(req: Request): number {
  return reads.get(req) ?? 0;
}
