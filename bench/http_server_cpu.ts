/**
 * The servers' CPU time over a timed HTTP bench phase, from `/metrics`
 * (`attn_thread_cpu_seconds_total`: each thread that renders metrics, its own, summed over
 * device threads; `attn_process_cpu_seconds_total`: the process's, every thread the same value;
 * server/thread_cpu.ts), summed over instances. Read twice back to back before the phase (the
 * second read's growth is what one scrape costs, taken off) and once after it, so the phase's
 * CPU a call is the serving threads' own work: a busy host's waits do not add to it as they
 * add to wall time. Under Dawn it includes the poll spin (gpu/dawn_tick_pace.ts: the event loop
 * kept turning for up to 2 ms after each submit), so a wait for the GPU counts while it spins.
 * The thread counts come in 10 ms ticks on Linux (64 calls: +-0.16 ms a call; 512: +-0.02); the
 * process's in microseconds, Dawn's own threads included (and the scrapes: not taken off).
 * @module
 */
import { metricsText } from "./http_dawn_poll.ts";

/** CPU seconds of the serving threads and of the processes. */
export interface ServerCpu {
  thread_s: number;
  process_s: number;
}

/** The CPU counters in a Prometheus text; null when it has none. */
export function serverCpuOf(metrics: string): ServerCpu | null {
  const sum = (name: string, first: boolean) => {
    let v = NaN;
    for (const [, x] of metrics.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "gm"))) {
      // Every thread reports the process's value: take one.
      v = Number.isNaN(v) ? Number(x) : first ? v : v + Number(x);
    }
    return v;
  };
  const thread_s = sum("attn_thread_cpu_seconds_total", false);
  const process_s = sum("attn_process_cpu_seconds_total", true);
  return Number.isFinite(thread_s) && Number.isFinite(process_s) ? { thread_s, process_s } : null;
}

/** Every instance's counters now, summed; null when one has none. */
export async function readServerCpu(
  urls: string[],
  headers: Record<string, string>,
): Promise<ServerCpu | null> {
  const all = await Promise.all(urls.map(async (u) => {
    const text = await metricsText(u, headers);
    return text === null ? null : serverCpuOf(text);
  }));
  if (all.some((c) => !c)) return null;
  return all.reduce<ServerCpu>(
    (a, c) => ({ thread_s: a.thread_s + c!.thread_s, process_s: a.process_s + c!.process_s }),
    { thread_s: 0, process_s: 0 },
  );
}

/** A phase's CPU: ms a call of the serving threads and of the processes, and a scrape's cost. */
export interface PhaseCpu {
  calls: number;
  thread_ms_per_call: number;
  process_ms_per_call: number;
  /** Serving-thread CPU ms one /metrics scrape cost (taken off the phase's). */
  scrape_thread_ms: number;
  /** The serving threads' CPU time over the phase's wall time (1: one thread always busy). */
  thread_busy?: number;
}

/** Brackets a phase: `start()` just before it, `end(calls, wall_ms?)` just after. */
export class CpuBracket {
  #a: ServerCpu | null = null;
  #b: ServerCpu | null = null;
  constructor(private urls: string[], private headers: Record<string, string>) {}

  async start(): Promise<void> {
    this.#a = await readServerCpu(this.urls, this.headers);
    this.#b = await readServerCpu(this.urls, this.headers);
  }

  async end(calls: number, wall_ms?: number): Promise<PhaseCpu | null> {
    const c = await readServerCpu(this.urls, this.headers), a = this.#a, b = this.#b;
    if (!a || !b || !c || calls <= 0) return null;
    const scrape = b.thread_s - a.thread_s;
    const thread = Math.max(0, c.thread_s - b.thread_s - scrape);
    const r = (x: number) => Math.round(x * 1e4) / 1e4;
    return {
      calls,
      thread_ms_per_call: r(thread * 1e3 / calls),
      process_ms_per_call: r(Math.max(0, c.process_s - b.process_s) * 1e3 / calls),
      scrape_thread_ms: r(scrape * 1e3),
      ...(wall_ms ? { thread_busy: r(thread * 1e3 / wall_ms) } : {}),
    };
  }
}
