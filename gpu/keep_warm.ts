/**
 * Keep-warm: holds the GPU's clock up between calls. Measured on the H200 (bench/NOTES.md v0.5,
 * v0.6): a served decode call's kernels ran at 345-420 MHz of 1,980, because the driver lowers the
 * SM clock within seconds of idling and a light, bursty load (one 0.1 ms call every few ms) does
 * not raise it again; the same call's GPU time was 0.11 ms at full clock and 0.44-0.50 ms served.
 *
 * {@link KeepWarmProvider} wraps the server's {@link DeviceProvider}: each use of the device (a
 * forward call, a cache write) re-arms a window of `hold_ms`, and while it is open it submits
 * short spin dispatches (`workgroups` workgroups of 64 lanes, `spin_iters` dependent FMA pairs
 * each: about 8 cycles an iteration). The spin touches only its own buffer, so no barrier orders
 * it against a real call's work. Spinning draws power: it is off by default (`hold_ms` 0), the
 * operator's alternative being locked clocks (`nvidia-smi --lock-gpu-clocks`, root).
 *
 * Three modes. `timer` (the default) submits `depth` spins every `period_ms` from a timer and
 * awaits nothing: while any Dawn promise is pending, Dawn's node binding re-queues its event
 * processing with `setImmediate` without pause, and on the H200 that slowed the server's reads of
 * request bodies ~10x (bench/NOTES.md v0.6, call 3). The queue is bounded without per-spin waits
 * (gpu/keep_warm_pace.ts): from one spin's time measured once at start, scaled for the idle clock,
 * and recalibrated by one completion wait every `sync_ms` (500), pending only until the queue
 * drains. `await` (the v0.6 loop) keeps `depth` spins queued, awaiting `onSubmittedWorkDone` for
 * each: a wait always pending, so Dawn's loop never rests (the in-process bench uses it: no HTTP).
 * `process` runs the spins in a Deno process of its own with its own Dawn device
 * (gpu/keep_warm_child.ts): the clock is the card's, and the serving thread only writes a byte to
 * the child's stdin now and then (every use re-arms the child's window; gpu/keep_warm_process.ts).
 * It needs `--allow-run` and an adapter Dawn can use.
 *
 * `timer` and `await` need a runtime whose completion wait does not block the JS thread: Deno's
 * own WebGPU blocks ~11 ms per `onSubmittedWorkDone`. {@link KeepWarmProvider.start} measures the
 * completion round trip and stays off, saying why, where it is over {@link MAX_ROUND_TRIP_MS}.
 * @module
 */
import type { DeviceProvider, DeviceReport, GpuContext, KeepWarmReport } from "../core/types.ts";
import { completionRoundTrip } from "./runtime_device.ts";
import { DEFAULT_SYNC_MS, SpinPacer } from "./keep_warm_pace.ts";
import { KeepWarmChild } from "./keep_warm_process.ts";
import {
  bindSpinKernel,
  checkKeepWarmOptions,
  KEEP_WARM_DEFAULTS,
  type KeepWarmOptions,
  measureSpin,
  type SpinKernel,
  submitSpins,
} from "./keep_warm_options.ts";

export {
  checkKeepWarmOptions,
  KEEP_WARM,
  KEEP_WARM_DEFAULTS,
  KEEP_WARM_MODES,
  type KeepWarmMode,
  type KeepWarmOptions,
} from "./keep_warm_options.ts";

/** Completion round trips (median ms) above this leave keep-warm off. */
export const MAX_ROUND_TRIP_MS = 1;

/** What keep-warm did (`/v1/device`'s `keep_warm`, the bench). */
export interface KeepWarmStats extends KeepWarmReport {
  options: KeepWarmOptions;
  /** `timer`, `process`: one spin's device time measured at start, in ms. */
  spin_ms?: number;
  /** `process`: the adapter the spinner process found. */
  process_adapter?: string;
  /** `timer`: the ms of work one spin is believed to add now (gpu/keep_warm_pace.ts). */
  spin_unit_ms?: number;
  /** `timer`: ticks that submitted nothing because enough was believed queued. */
  skipped_ticks: number;
  /** `timer`: calibrating completion waits done. */
  syncs: number;
  /** Keep-warm's `onSubmittedWorkDone` promises pending now (`timer`: 0 between ticks). */
  pending_waits: number;
}

/** A {@link DeviceProvider} that keeps the GPU busy for `hold_ms` after each use (module doc). */
export class KeepWarmProvider implements DeviceProvider {
  readonly #inner: DeviceProvider;
  readonly #o: KeepWarmOptions;
  #enabled = false;
  #reason?: string;
  #roundTrip?: number;
  #spinMs?: number;
  #last = -Infinity;
  #loop: Promise<void> | null = null;
  #timer: ReturnType<typeof setInterval> | null = null;
  #pacer: SpinPacer | null = null;
  #closed = false;
  #dispatches = 0;
  #pending = 0;
  #child: KeepWarmChild | null = null;

  readonly #maxRoundTrip: number;
  readonly #syncMs: number;
  readonly #dawnFlags: readonly string[];

  /**
   * Knobs left out take {@link KEEP_WARM_DEFAULTS}. `max_round_trip_ms`: the slowest completion
   * round trip it runs with; `sync_ms`: `timer`'s ms between calibrating waits (tests set them);
   * `dawn_flags`: `process`'s Dawn flags (the runtime's).
   */
  constructor(
    inner: DeviceProvider,
    options: Partial<KeepWarmOptions>,
    { max_round_trip_ms = MAX_ROUND_TRIP_MS, sync_ms = DEFAULT_SYNC_MS, dawn_flags = [] }: {
      max_round_trip_ms?: number;
      sync_ms?: number;
      dawn_flags?: readonly string[];
    } = {},
  ) {
    this.#inner = inner;
    this.#o = checkKeepWarmOptions({ ...KEEP_WARM_DEFAULTS, ...options });
    this.#maxRoundTrip = max_round_trip_ms;
    this.#syncMs = sync_ms;
    this.#dawnFlags = dawn_flags;
  }

  /** Measures the completion round trip (and `timer`: the spin); turns on where it is short. */
  async start(): Promise<KeepWarmStats> {
    const ctx = this.#inner.current();
    if (this.#o.hold_ms === 0) this.#reason = "hold_ms is 0";
    else if (!ctx) this.#reason = "no device";
    else if (this.#o.mode === "process") {
      const child = await KeepWarmChild.start({ ...this.#o, flags: [...this.#dawnFlags] });
      if (typeof child === "string") this.#reason = child;
      else [this.#child, this.#enabled] = [child, true];
    } else {
      const { ms } = await completionRoundTrip(ctx.device, 5);
      const sorted = [...ms].sort((a, b) => a - b);
      this.#roundTrip = sorted[sorted.length >> 1];
      if (this.#roundTrip > this.#maxRoundTrip) {
        this.#reason = `the runtime's completion round trip is ${this.#roundTrip.toFixed(2)} ms ` +
          `(over ${this.#maxRoundTrip} ms: its waits would block the JS thread)`;
      } else {
        if (this.#o.mode === "timer") {
          this.#spinMs = await measureSpin(
            ctx.device,
            await this.#spinKernel(ctx),
            this.#roundTrip,
          );
          const o = this.#o;
          this.#pacer = new SpinPacer(this.#spinMs, o.period_ms, o.depth, this.#syncMs);
        }
        this.#enabled = true;
      }
    }
    return this.stats();
  }

  current(): GpuContext | null {
    const g = this.#inner.current();
    if (g) this.#touch(g);
    return g;
  }

  async acquire(): Promise<GpuContext | null> {
    const g = await this.#inner.acquire();
    if (g) this.#touch(g);
    return g;
  }

  report(): DeviceReport {
    return { ...this.#inner.report(), keep_warm: this.stats() };
  }

  stats(): KeepWarmStats {
    const child = this.#child?.stats();
    if (child) {
      return {
        enabled: this.#enabled && !child.ended,
        ...(child.ended ? { reason: child.ended } : {}),
        options: { ...this.#o },
        spin_ms: child.spin_ms,
        process_adapter: child.adapter,
        dispatches: child.dispatches,
        skipped_ticks: 0,
        syncs: 0,
        pending_waits: 0,
        spinning: child.spinning,
      };
    }
    return {
      enabled: this.#enabled,
      ...(this.#reason ? { reason: this.#reason } : {}),
      options: { ...this.#o },
      ...(this.#roundTrip !== undefined ? { round_trip_ms: this.#roundTrip } : {}),
      ...(this.#spinMs !== undefined ? { spin_ms: this.#spinMs } : {}),
      ...(this.#pacer ? { spin_unit_ms: this.#pacer.unit } : {}),
      dispatches: this.#dispatches,
      skipped_ticks: this.#pacer?.skipped ?? 0,
      syncs: this.#pacer?.syncs ?? 0,
      pending_waits: this.#pending,
      spinning: this.#loop !== null || this.#timer !== null,
    };
  }

  /** Stops spinning; resolves once the last spin completed. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#child?.close();
    this.#stopTimer();
    await this.#loop;
    const g = this.#inner.current();
    if (g && !g.lost && this.#dispatches > 0) await this.#wait(g);
  }

  #touch(g: GpuContext): void {
    if (!this.#enabled || this.#closed) return;
    if (this.#child) return this.#child.ping();
    this.#last = performance.now();
    if (this.#loop || this.#timer !== null) return;
    if (this.#o.mode === "await") {
      this.#loop = this.#spin(g).catch(() => {}).finally(() => this.#loop = null);
      return;
    }
    this.#timer = setInterval(() => this.#tick(g), this.#o.period_ms);
    this.#tick(g);
  }

  #open(g: GpuContext): boolean {
    return !this.#closed && !g.lost && performance.now() - this.#last < this.#o.hold_ms;
  }

  #stopTimer(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  /** `timer`: `depth` spins, unless enough is believed queued; awaits nothing but a sync. */
  #tick(g: GpuContext): void {
    const pacer = this.#pacer;
    if (!pacer || !this.#open(g)) return this.#stopTimer();
    const k = this.#kernel(g);
    if (!k) return; // compiled at start; a re-acquired device compiles it on its first tick
    const now = performance.now();
    try {
      if (pacer.tick(now)) this.#submit(g, k, this.#o.depth);
    } catch {
      return this.#stopTimer();
    }
    if (pacer.wantSync(now)) {
      pacer.syncIssued(now);
      this.#wait(g).then(() => pacer.syncDone(performance.now()), () => {});
    }
  }

  #kernels = new WeakMap<GPUDevice, SpinKernel>();
  #compiling = new WeakSet<GPUDevice>();

  /** The spin pipeline and bind group of `g`'s device, or null while it compiles. */
  #kernel(g: GpuContext): SpinKernel | null {
    const have = this.#kernels.get(g.device);
    if (have || this.#compiling.has(g.device)) return have ?? null;
    this.#compiling.add(g.device);
    this.#spinKernel(g).catch(() => {});
    return null;
  }

  /** The spin pipeline with its sink bound, compiled and bound once per device. */
  async #spinKernel(g: GpuContext): Promise<SpinKernel> {
    const have = this.#kernels.get(g.device);
    if (have) return have;
    const spin = await bindSpinKernel(g, this.#o.spin_iters, this.#o.workgroups);
    this.#kernels.set(g.device, spin);
    return spin;
  }

  #submit(g: GpuContext, k: SpinKernel, n: number) {
    submitSpins(g.device, k, n);
    this.#dispatches += n;
  }

  async #wait(g: GpuContext): Promise<void> {
    this.#pending++;
    try {
      await g.device.queue.onSubmittedWorkDone();
    } finally {
      this.#pending--;
    }
  }

  /** `await`: keeps `depth` spins queued, awaiting each (module doc). */
  async #spin(g: GpuContext): Promise<void> {
    const bound = await this.#spinKernel(g);
    const queued: Promise<unknown>[] = [];
    while (this.#open(g)) {
      this.#submit(g, bound, 1);
      queued.push(this.#wait(g));
      if (queued.length >= this.#o.depth) await queued.shift();
    }
    await Promise.all(queued);
  }
}
