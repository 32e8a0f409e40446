/**
 * How long a request body may take (nginx's `client_body_timeout`): the limit, the 408 past it,
 * and a stream read that gives up after it. body_read.ts applies it to every body read, in
 * whichever isolate reads bodies.
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import { envVar, parseVariable } from "../core/env.ts";
import { MAX_TIMER_MS, timerMs } from "../core/timeout.ts";

/** The environment variable {@link bodyTimeoutMs} reads (`--body-timeout-ms` sets it). */
export const BODY_TIMEOUT_ENV = "ATTN_BODY_TIMEOUT_MS";

/** The default {@link bodyTimeoutMs}: nginx's `client_body_timeout`, 60 s. */
export const DEFAULT_BODY_TIMEOUT_MS = 60_000;

/** Bytes a body read in one piece gets each extra second for: 256 KiB. */
export const WHOLE_BODY_BYTES_PER_S = 256 * 1024;

/**
 * How long a streamed body may go without new bytes, in ms (`ATTN_BODY_TIMEOUT_MS`, set by the
 * serve flag `--body-timeout-ms`; default 60 s). Read from the environment each time, so every
 * isolate that reads bodies (HTTP workers, the device-threads front) has the same limit.
 */
export function bodyTimeoutMs(): number {
  const v = Number(envVar(BODY_TIMEOUT_ENV) ?? DEFAULT_BODY_TIMEOUT_MS);
  return Number.isInteger(v) && v >= 1 && v <= MAX_TIMER_MS ? v : DEFAULT_BODY_TIMEOUT_MS;
}

/**
 * The deadline of a body read in one piece (body_read.ts `wholeBody`, which sees no chunks):
 * the body timeout plus 1 s per 256 KiB declared, so a client must send at 256 KiB/s or more
 * on average once the first timeout's worth of time has passed.
 */
export function wholeBodyDeadlineMs(declared: number, timeoutMs = bodyTimeoutMs()): number {
  const extra = Math.ceil(Math.max(0, declared) / WHOLE_BODY_BYTES_PER_S) * 1000;
  return Math.min(MAX_TIMER_MS, timeoutMs + extra);
}

/** `--body-timeout-ms` over ATTN_BODY_TIMEOUT_MS over the default; 1 ms to ~24.8 days. */
export function bodyTimeoutOption(flag: string | undefined, env: string | undefined): number {
  if (flag !== undefined) return timerMs("--body-timeout-ms", flag, 1);
  if (env === undefined || env === "") return DEFAULT_BODY_TIMEOUT_MS;
  return parseVariable(BODY_TIMEOUT_ENV, env, () => timerMs(BODY_TIMEOUT_ENV, env, 1));
}

/**
 * A body that did not come in time, 408: a streamed one stalled for `timeoutMs` after `got`
 * bytes; one read in one piece (`deadlineMs` given; how many bytes came is not known) was not
 * whole by its deadline.
 */
export function timedOut(
  got: number,
  declared: number,
  timeoutMs: number,
  deadlineMs?: number,
): ServiceError {
  const extra = { body_timeout_ms: timeoutMs };
  if (deadlineMs !== undefined) {
    return new ServiceError(
      `request body of ${declared} declared bytes not whole within ${deadlineMs} ms ` +
        `(body_timeout_ms ${timeoutMs}, plus 1 s per 256 KiB declared for a body read in one ` +
        "piece)",
      { status: 408, code: "body_timeout", extra: { ...extra, deadline_ms: deadlineMs } },
    );
  }
  const of = declared >= 0 ? ` of the ${declared} declared` : "";
  return new ServiceError(
    `request body stalled after ${got}${of} bytes: no bytes for ${timeoutMs} ms ` +
      `(body_timeout_ms ${timeoutMs})`,
    { status: 408, code: "body_timeout", extra: { ...extra, received_bytes: got } },
  );
}

/** A timer that fires this much past its time says the thread was busy, not the client idle. */
const LATE_MS = 100;

/**
 * Resolves null after `ms` of waiting, or of waiting again once more when the timer fired over
 * 100 ms late: a thread busy past the limit (a long call on Deno's runtime holds it) must not
 * turn a body whose bytes were arriving meanwhile into a 408. `cancel` clears the timer.
 */
export function patientTimeout(ms: number): { done: Promise<null>; cancel(): void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const done = new Promise<null>((resolve) => {
    const arm = (again: boolean) => {
      const due = performance.now() + ms;
      timer = setTimeout(() => {
        if (!again && performance.now() - due > LATE_MS) arm(true);
        else resolve(null);
      }, ms);
    };
    arm(false);
  });
  return { done, cancel: () => clearTimeout(timer) };
}

/** The reader's next chunk, or null when none comes within `ms` ({@link patientTimeout}). */
export async function readWithin(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  ms: number,
): Promise<ReadableStreamReadResult<Uint8Array> | null> {
  const late = patientTimeout(ms);
  try {
    return await Promise.race([reader.read(), late.done]);
  } finally {
    late.cancel();
  }
}
