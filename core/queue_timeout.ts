/**
 * A forward call's queue timeout: the most milliseconds the caller lets the call wait between
 * its arrival (its body read and decoded) and its start (behind earlier calls on its cache, for
 * the device). A call past it is not run and answers 503 `queue_timeout`
 * ({@link QueueTimeoutError}): nothing was written, so a caller that times out knows its call had
 * no effect. In the library it is the forward option `queueTimeoutMs`; over HTTP the request
 * header `X-Attention-Queue-Timeout-Ms` (server/queue_timeout_header.ts), under the same rule.
 * @module
 */
import { QueueTimeoutError, ServiceError } from "./errors.ts";
import { MAX_TIMER_MS } from "./timeout.ts";

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
  const got = typeof ms === "number" ? String(ms) : JSON.stringify(ms) ?? String(ms);
  throw new ServiceError(`queueTimeoutMs must be ${QUEUE_TIMEOUT_RULE}; got ${got}`, {
    status: 400,
    code: "invalid_request",
    issues: [{ path: ["queueTimeoutMs"], message: `must be ${QUEUE_TIMEOUT_RULE}; got ${got}` }],
  });
}

/**
 * The check before a call starts: past its timeout (`waitedMs` since it arrived), it does not run.
 * @throws QueueTimeoutError 503 `queue_timeout`.
 */
export function checkQueueWait(timeoutMs: number | undefined, waitedMs: number): void {
  if (timeoutMs !== undefined && waitedMs > timeoutMs) {
    throw new QueueTimeoutError(timeoutMs, waitedMs);
  }
}
