/**
 * Checks of single serve flag values that the command line parses (serve_options.ts
 * `parseServeArgs`): integers, timer milliseconds, and `--allowed-host`.
 * @module
 */
import { timerMs } from "../core/timeout.ts";

export function intFlag(name: string, v: string | undefined, dflt: number, min: number): number {
  if (v === undefined) return dflt;
  if (!/^\d+$/.test(v) || Number(v) < min) {
    throw new Error(`--${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`);
  }
  if (!Number.isSafeInteger(Number(v))) {
    const most = Number.MAX_SAFE_INTEGER;
    throw new Error(`--${name} must be at most ${most} (2^53 - 1), got ${JSON.stringify(v)}`);
  }
  return Number(v);
}

/** A millisecond flag that sets a timer: `min` to core/timeout.ts MAX_TIMER_MS (longer fires at once). */
export function msFlag(name: string, v: string | undefined, dflt: number, min: number): number {
  return v === undefined ? dflt : timerMs(`--${name}`, v, min);
}

/**
 * An `--allowed-host` value: a host name or a bracketed IPv6 address, as the Host check
 * compares them (auth.ts `hostName`: no port, which it does not compare).
 */
const ALLOWED_HOST_PATTERN =
  /^(?:[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*\.?|\[[0-9a-f:.]+\])$/i;

/** `--allowed-host` (repeatable); @throws Error on a value the Host check could never match. */
export function allowedHostsOption(v: string[] | undefined): string[] {
  for (const h of v ?? []) {
    if (!ALLOWED_HOST_PATTERN.test(h)) {
      throw new Error(
        "--allowed-host must be a host name or a bracketed IPv6 address, without a port (any " +
          `port is answered), got ${JSON.stringify(h)}`,
      );
    }
  }
  return v ?? [];
}
