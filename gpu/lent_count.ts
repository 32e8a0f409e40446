/**
 * How many read-backs are lent out (gpu/readback_memory.ts) and a wait for none, in a module of
 * its own so that the device manager (gpu/device.ts) can wait for them at close without
 * importing the pools that import it.
 * @module
 */

let out = 0;
const waiters: (() => void)[] = [];

/** Read-backs lent and not yet given back. */
export function lentOut(): number {
  return out;
}

/** One more lent. */
export function countLent(): void {
  out++;
}

/** One given back; wakes {@link lentReturned}'s waiters when none is left. */
export function countReturned(): void {
  out--;
  if (out === 0) { for (const w of waiters.splice(0)) w(); }
}

/** Resolves once no read-back is lent out (at once when none is). */
export function lentReturned(): Promise<void> {
  if (out === 0) return Promise.resolve();
  return new Promise((resolve) => waiters.push(resolve));
}
