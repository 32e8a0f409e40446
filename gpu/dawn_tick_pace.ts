/**
 * Paces Dawn's event polling. While any Dawn promise is pending, dawn.node (npm `webgpu`
 * 0.6.2, `AsyncRunner::ScheduleProcessEvents`) re-queues its poll with
 * `globalThis.setImmediate(Napi::Function::New(lambda))`: a new native function every tick,
 * each with a Node-API finalizer. Under Deno 2.9.6 those finalizers sit in one list that is
 * searched and shifted for each one freed, so freeing n of them costs n² (bench/NOTES.md
 * "v0.7 Dawn stalls"): one 15 s wait on lavapipe left ~400k of them, and freeing them held the
 * JS thread for minutes with the device idle (gdb: the test thread inside Deno's napi code,
 * every entry `default_finalizer<CallbackData<AsyncRunner::ScheduleProcessEvents...>>`).
 *
 * {@link installDawnTickPacing} wraps `globalThis.setImmediate` so that a chain of immediates
 * (each one queued from the callback of the one before: Dawn's poll loop) runs unpaced for
 * `spin_ms`, then as timers `delay = clamp(elapsed / 16, 1, max_delay_ms)` apart: a wait of T
 * ms makes about spin_ms x (ticks per ms) + 16 ln(T) + T / max_delay_ms functions instead of
 * T x (ticks per ms), for at most 1/16 of T (capped at max_delay_ms) of added latency.
 *
 * Within the unpaced spin, Dawn's poll runs at most once per `max(spin_gap_ms, elapsed / 16)`
 * (0.01 ms at first): the event-loop turns between are the pacer's own plain JS immediates, so
 * the loop turns (sockets, other calls) as often as before, but a spin makes ~60 native
 * functions instead of one a turn (~80 a ms on lavapipe's 2-core VM, v0.31). Serving makes many
 * short waits, each under `spin_ms`: before the gap, 8 clients on Dawn (lavapipe) made ~150 polls
 * a call, and freeing them held the thread 2-3 s every few seconds (bench/NOTES.md v0.31). A
 * short wait ends at most max(0.01, T / 16) ms late.
 * {@link wakeDawnPoll} (each launch's submit) starts a new unpaced `spin_ms`. A paced tick's
 * handle is a timer's: `clearImmediate` does not cancel it (nothing of ours clears immediates;
 * dawn.node ignores the handle).
 * @module
 */
import { type EnvSetting, mustBe, readSetting } from "../core/env.ts";
import { trace } from "../core/trace.ts";

/** The pacing knobs. */
export interface TickPace {
  /** A chain of immediates runs unpaced this long, in ms (Infinity: never paced). */
  spin_ms: number;
  /** The longest delay between two paced ticks, in ms. */
  max_delay_ms: number;
  /**
   * Within the unpaced spin, Dawn's poll runs at most once per `max(spin_gap_ms, elapsed / 16)`
   * ms; the event-loop turns between are the pacer's own (plain JS immediates, no native
   * function). Infinity: Dawn's poll runs every turn (before v0.31).
   */
  spin_gap_ms: number;
}

/** Defaults: 2 ms unpaced (Dawn polled at least 0.01 ms apart), then at most 16 ms apart. */
export const DEFAULT_TICK_PACE: Readonly<TickPace> = Object.freeze({
  spin_ms: 2,
  max_delay_ms: 16,
  spin_gap_ms: 0.01,
});

/**
 * A setting of ms or `off`: a decimal number >= 0 (`0.5`, `2`; no sign, exponent or bare
 * point), or `off` (Infinity).
 */
function msOrOff(name: string, unset: number): EnvSetting<number> {
  return {
    name,
    unset,
    parse(text) {
      if (text === "off") return Infinity;
      if (/^\d+(\.\d+)?$/.test(text) && Number.isFinite(Number(text))) return Number(text);
      throw mustBe(name, text, "a number of ms >= 0, or off");
    },
  };
}

/** `ATTN_DAWN_TICK_SPIN_MS`: the unpaced spin, or `off` (never paced); default 2. */
export const DAWN_TICK_SPIN_SETTING: EnvSetting<number> = msOrOff(
  "ATTN_DAWN_TICK_SPIN_MS",
  DEFAULT_TICK_PACE.spin_ms,
);

/**
 * `ATTN_DAWN_TICK_GAP_MS`: the least gap between two of Dawn's polls within the unpaced spin,
 * or `off` (a poll every event-loop turn, as before v0.31); default 0.01.
 */
export const DAWN_TICK_GAP_SETTING: EnvSetting<number> = msOrOff(
  "ATTN_DAWN_TICK_GAP_MS",
  DEFAULT_TICK_PACE.spin_gap_ms,
);

/**
 * The pacing from `ATTN_DAWN_TICK_SPIN_MS`, `ATTN_DAWN_TICK_GAP_MS` and the defaults, read
 * now (each time the pacer is installed): a bad value throws an EnvValueError naming it (the
 * server refuses it at start-up, server/serve_env.ts).
 */
export function tickPaceFromEnv(): TickPace {
  return {
    ...DEFAULT_TICK_PACE,
    spin_ms: readSetting(DAWN_TICK_SPIN_SETTING),
    spin_gap_ms: readSetting(DAWN_TICK_GAP_SETTING),
  };
}

/** Counts of what the pacer did since it was installed. */
export interface TickPaceStats {
  /** Immediates run as immediates (unpaced). */
  immediate: number;
  /** Immediates run as timers (paced). */
  paced: number;
  /** The pacer's own event-loop turns, run instead of Dawn's poll within the spin's gaps. */
  gap_turns: number;
}

type SetImmediate = (cb: (...a: unknown[]) => void, ...args: unknown[]) => unknown;
interface Host {
  setImmediate?: SetImmediate;
}

interface Installed {
  stats: TickPaceStats;
  pace: TickPace;
  wake(): void;
}

const installed = new WeakMap<object, Installed>();

/**
 * A new wait begins (a launch's submit): Dawn's poll runs unpaced for `spin_ms` again, and a
 * paced tick already queued runs now, so a long wait in flight (a compile, a keep-warm wait)
 * does not add its delay to a short one. A no-op when the pacer is not installed (`host`:
 * the one it was installed on, globalThis by default).
 */
export function wakeDawnPoll(host?: object): void {
  installed.get(host ?? globalThis)?.wake();
}

/** The counts of the pacer installed on `host` (globalThis by default), or undefined. */
export function dawnTickPacing(host?: object): Readonly<TickPaceStats> | undefined {
  return installed.get(host ?? globalThis)?.stats;
}

/**
 * Wraps `host.setImmediate` (once per host; a later call only updates the knobs). Returns the
 * live counts. A host without `setImmediate` is left alone (Dawn then cannot poll anyway).
 */
export function installDawnTickPacing(
  pace: TickPace = tickPaceFromEnv(),
  host: Host = globalThis as unknown as Host,
): TickPaceStats {
  const had = installed.get(host);
  if (had) {
    had.pace = { ...pace };
    return had.stats;
  }
  const real = host.setImmediate;
  let chainStart = 0;
  let timer: ReturnType<typeof setTimeout> | undefined; // the paced tick queued, if any
  let queued: (() => void) | undefined; // its callback
  let dueAt = 0; // an unpaced tick waiting out its gap runs at the first turn from this time
  const state: Installed = {
    stats: { immediate: 0, paced: 0, gap_turns: 0 },
    pace: { ...pace },
    wake() {
      chainStart = performance.now();
      dueAt = 0;
      if (timer === undefined || !queued || typeof real !== "function") return;
      clearTimeout(timer);
      const run = queued;
      timer = queued = undefined;
      state.stats.immediate++;
      real.call(host, run);
    },
  };
  installed.set(host, state);
  if (typeof real !== "function") return state.stats;
  let inTick = false; // true while a callback queued through this wrapper runs
  let pacedSince = -1; // the chain's start when its pacing was traced, else -1
  host.setImmediate = function pacedImmediate(cb, ...args) {
    const now = performance.now();
    if (!inTick) chainStart = now; // queued from outside a tick: a new chain
    const elapsed = now - chainStart;
    const run = () => {
      inTick = true;
      try {
        cb(...args);
      } finally {
        inTick = false;
      }
    };
    if (!(elapsed >= state.pace.spin_ms)) {
      state.stats.immediate++;
      const gap = Math.max(state.pace.spin_gap_ms, elapsed / 16);
      if (!inTick || !(gap < Infinity)) return real.call(host, run);
      // Queued by Dawn's poll itself: the next one waits out the gap on plain turns, each a JS
      // closure where a poll would make a native function whose release costs Deno O(n).
      dueAt = now + gap;
      const turn = () => {
        if (performance.now() >= dueAt) return run();
        state.stats.gap_turns++;
        real.call(host, turn);
      };
      return real.call(host, turn);
    }
    state.stats.paced++;
    if (pacedSince !== chainStart) {
      pacedSince = chainStart;
      trace(`dawn poll: a wait past ${state.pace.spin_ms} ms, paced`);
    }
    queued = run;
    timer = setTimeout(() => {
      timer = queued = undefined;
      run();
    }, Math.min(state.pace.max_delay_ms, Math.max(1, elapsed / 16)));
    return timer;
  };
  return state.stats;
}
