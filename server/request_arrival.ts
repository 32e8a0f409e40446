/**
 * When a request passed between threads arrived: the first thread that read its body (an HTTP
 * worker, a device thread's listener, the device-threads front) stamps the body it passes on with
 * the time the read ended (worker_protocol.ts BodyMessage `sentAt`), and every later hop keeps that stamp. The
 * thread that runs the call reads it back on its own clock ({@link arrivalOf}), so a forward's
 * queue timeout counts its wait for that thread too: on Deno's runtime a device thread waiting
 * for its GPU (up to a whole call) reads no message meanwhile.
 * @module
 */

/** Now, in ms since the epoch, on a clock the threads of a process share. */
export function epochNow(): number {
  return performance.timeOrigin + performance.now();
}

const stamps = new WeakMap<Request, number>();

/** Records a rebuilt request's body stamp (none: nothing recorded). */
export function keepSentAt(req: Request, sentAt: number | undefined): void {
  if (sentAt !== undefined) stamps.set(req, sentAt);
}

/**
 * When `req`'s body was whole, on this thread's `performance.now()` clock (never later than
 * now), or undefined for a request whose body was read on this thread.
 */
export function arrivalOf(req: Request): number | undefined {
  const sentAt = stamps.get(req);
  if (sentAt === undefined) return undefined;
  return Math.min(performance.now(), sentAt - performance.timeOrigin);
}
