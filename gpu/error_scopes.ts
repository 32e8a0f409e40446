/**
 * Error scopes that never stay open across an await. A device's scope stack is shared by
 * everything using it at once (launches, KV cache creation, compiles), so a scope pushed before
 * an await may be popped by someone else's pop after it: two overlapping compiles that held
 * their scopes across their awaits took each other's errors (bench/NOTES.md v0.26).
 * {@link inErrorScopes} pushes, runs the synchronous work, and pops every scope before it
 * returns; the errors come later as a promise.
 * @module
 */

/**
 * `f()` inside one error scope per filter of `filters` (innermost first), all popped before
 * this returns. The scopes' errors come in the same order, as a promise that never rejects. If
 * `f` throws, the scopes are popped all the same and the error is rethrown.
 */
export function inErrorScopes<T>(
  device: GPUDevice,
  filters: readonly GPUErrorFilter[],
  f: () => T,
): { value: T; errors: Promise<(GPUError | null)[]> } {
  for (let i = filters.length - 1; i >= 0; i--) device.pushErrorScope(filters[i]);
  let value: T | undefined, thrown: unknown, failed = false;
  try {
    value = f();
  } catch (e) {
    [thrown, failed] = [e, true];
  }
  const errors = Promise.all(filters.map(() => device.popErrorScope()));
  if (failed) {
    errors.catch(() => {});
    throw thrown;
  }
  return { value: value as T, errors };
}
