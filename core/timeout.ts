/**
 * A promise raced against a timer: {@link raceTimeout} resolves with the promise's value, or with
 * `"timeout"` once `ms` pass first, and clears its timer either way (no timer outlives the race).
 * @module
 */

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
