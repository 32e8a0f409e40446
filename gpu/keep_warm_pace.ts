/**
 * Keep-warm's timer pacing (gpu/keep_warm.ts, `--keep-warm-mode timer`): whether a tick submits
 * its spins, from a belief of how much spin work is queued, without awaiting each spin.
 *
 * The belief: every submitting tick adds `depth` x `unit` ms of work, drained at wall-clock
 * speed; a tick submits only while less than {@link MAX_TICKS_QUEUED} periods are believed
 * queued. `unit` starts at the spin time measured once at start x {@link SLOW_CLOCK_FACTOR} (the
 * H200's idle clock is 5.7x slower than its full clock), so the queue stays bounded whatever the
 * clock does. That alone would keep the GPU mostly idle once the clock is up (1/6 duty at most),
 * so every `sync_ms` one completion wait calibrates it: the wait's time against the work believed
 * queued when it was issued scales `unit` (x {@link CALIBRATION_MARGIN}, within
 * [spin / factor, spin x factor]). One wait pending for a few ms every `sync_ms` (default 500):
 * Dawn's event loop runs that long, not for good.
 * @module
 */

/** The spin's measured time is scaled by this until calibrated (1,980 / 345 MHz, rounded up). */
export const SLOW_CLOCK_FACTOR = 6;

/** A tick submits only while less than this many periods of spins are believed queued. */
export const MAX_TICKS_QUEUED = 2;

/** A calibrated `unit` is this much over the spin time the wait saw. */
export const CALIBRATION_MARGIN = 1.5;

/** A wait issued with less than this believed queued (ms) does not calibrate: the round trip. */
export const MIN_CALIBRATION_MS = 1;

/** The default ms between calibrating waits. */
export const DEFAULT_SYNC_MS = 500;

/** The least spin time (ms) the pacer works from: a coarse clock can measure a spin as 0. */
export const MIN_SPIN_MS = 1e-3;

/** The belief of queued spin work (module doc). All times in ms, `now` from the caller. */
export class SpinPacer {
  readonly #spin: number;
  readonly #period: number;
  readonly #depth: number;
  readonly #syncMs: number;
  #unit: number;
  #busyUntil = -Infinity;
  #pending: { t: number; queued: number; after: number } | null = null;
  #lastSync: number | null = null;
  skipped = 0;
  syncs = 0;

  /** `spin_ms`: one spin's time measured at start. */
  constructor(spin_ms: number, period_ms: number, depth: number, sync_ms = DEFAULT_SYNC_MS) {
    this.#spin = Math.max(spin_ms, MIN_SPIN_MS);
    this.#period = period_ms;
    this.#depth = depth;
    this.#syncMs = sync_ms;
    this.#unit = this.#spin * SLOW_CLOCK_FACTOR;
  }

  /** The ms of work one spin is believed to add. */
  get unit(): number {
    return this.#unit;
  }

  /** The ms of spin work believed queued at `now`. */
  queued(now: number): number {
    return Math.max(0, this.#busyUntil - now);
  }

  /** Whether a tick at `now` submits its `depth` spins; counts them in the belief if so. */
  tick(now: number): boolean {
    const queued = this.queued(now);
    if (queued >= MAX_TICKS_QUEUED * this.#period) {
      this.skipped++;
      return false;
    }
    this.#busyUntil = now + queued + this.#depth * this.#unit;
    if (this.#pending) this.#pending.after += this.#depth;
    return true;
  }

  /** Whether to issue a calibrating wait at `now`: none pending, `sync_ms` since the last. */
  wantSync(now: number): boolean {
    if (this.#pending) return false;
    if (this.#lastSync === null) this.#lastSync = now; // the first a sync_ms after the start
    return now - this.#lastSync >= this.#syncMs;
  }

  /** A wait was issued at `now` (after this tick's spins). */
  syncIssued(now: number): void {
    this.#pending = { t: now, queued: this.queued(now), after: 0 };
    this.#lastSync = now;
  }

  /** The wait issued at `syncIssued` resolved at `now`: calibrates `unit` and the belief. */
  syncDone(now: number): void {
    const p = this.#pending;
    if (!p) return;
    this.#pending = null;
    this.syncs++;
    if (p.queued >= MIN_CALIBRATION_MS) {
      const seen = (now - p.t) / p.queued; // actual / believed
      const lo = this.#spin / SLOW_CLOCK_FACTOR, hi = this.#spin * SLOW_CLOCK_FACTOR;
      this.#unit = Math.min(hi, Math.max(lo, this.#unit * seen * CALIBRATION_MARGIN));
    }
    this.#busyUntil = now + p.after * this.#unit;
  }
}
