/**
 * A promise raced against a timer: {@link raceTimeout} resolves with the promise's value, or with
 * `"timeout"` once `ms` pass first, and clears its timer either way (no timer outlives the race).
 * And the longest timer there is ({@link MAX_TIMER_MS}), with the one check of a timer length
 * given as text ({@link timerMs}).
 * @module
 */

/**
 * The longest timer `setTimeout` keeps, 2^31 - 1 ms (~24.8 days): a longer one fires at once
 * (TimeoutOverflowWarning). Every millisecond flag and variable that sets a timer stops here.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * `v`, a flag's or variable's text, as a timer length: an integer from `min` to
 * {@link MAX_TIMER_MS} ms.
 * @throws Error naming `name` and `v` otherwise.
 */
export function timerMs(name: string, v: string, min: number): number {
  const n = Number(v);
  if (!/^\d+$/.test(v) || n < min || n > MAX_TIMER_MS) {
    throw new Error(
      `${name} must be an integer from ${min} to ${MAX_TIMER_MS}, got ${JSON.stringify(v)}`,
    );
  }
  return n;
}

/** `p`'s value, or `"timeout"` when `ms` milliseconds pass first; a rejection of `p` rejects. */
export async function raceTimeout<T>(p: Promise<T>, ms: number): Promise<T | "timeout"> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
