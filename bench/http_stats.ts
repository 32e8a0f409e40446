/**
 * Summaries of the HTTP bench's timed calls: client round-trip p50/p99 (nearest rank), and the
 * median of each of the server's own per-phase timings (`__metadata__.timings`), the phases
 * ordered as the forward path runs them.
 * @module
 */

/** A timed call as the summaries need it. */
export interface Timed {
  ms: number;
  timings: Record<string, number>;
}

/** One phase's numbers. */
export interface PhaseStats {
  calls: number;
  /** Client round trip, ms. */
  p50_ms: number;
  p99_ms: number;
  min_ms: number;
  max_ms: number;
  /** Wall time of the phase and calls / wall second (for concurrent phases). */
  wall_ms?: number;
  calls_per_s?: number;
  /** Median of each server timing, ms (`plan_cached`: the fraction of calls that hit). */
  server: Record<string, number>;
  /** Median of (round trip - server `total`): HTTP, body parse and encode, client parse. */
  outside_total_ms?: number;
  /**
   * Median of (round trip - `total` - `parse`), where the server sent `parse`: the HTTP stack
   * both ways, the answer's encoding and the client's own work.
   */
  outside_server_ms?: number;
}

/** Nearest-rank quantile (q in [0, 1]) of a non-empty list. */
export function quantile(xs: number[], q: number): number {
  const s = xs.toSorted((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

const FIRST = [
  "parse",
  "validate",
  "plan",
  "plan_cached",
  "queue",
  "encode",
  "gpu_and_readback",
  "gpu",
];

/** Server timing keys in report order: the forward path's phases, `gpu_*`, the rest, `total`. */
export function timingOrder(keys: Iterable<string>): string[] {
  const all = [...new Set(keys)];
  const rank = (k: string) => {
    const i = FIRST.indexOf(k);
    if (i >= 0) return i;
    if (k === "total") return 1000;
    if (k.startsWith("gpu_")) return 100;
    return 200;
  };
  return all.sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** Summarises a phase's calls (wall_ms given for concurrent phases). */
export function phaseStats(calls: Timed[], wall_ms?: number): PhaseStats {
  if (calls.length === 0) {
    return { calls: 0, p50_ms: NaN, p99_ms: NaN, min_ms: NaN, max_ms: NaN, server: {} };
  }
  const ms = calls.map((c) => c.ms);
  const server: Record<string, number> = {};
  for (const k of timingOrder(calls.flatMap((c) => Object.keys(c.timings)))) {
    const xs = calls.map((c) => c.timings[k]).filter((x) => typeof x === "number");
    server[k] = k === "plan_cached" ? xs.reduce((a, b) => a + b, 0) / xs.length : quantile(xs, 0.5);
  }
  const outside = calls.filter((c) => typeof c.timings.total === "number")
    .map((c) => c.ms - c.timings.total);
  const out: PhaseStats = {
    calls: calls.length,
    p50_ms: quantile(ms, 0.5),
    p99_ms: quantile(ms, 0.99),
    min_ms: Math.min(...ms),
    max_ms: Math.max(...ms),
    server,
  };
  if (outside.length) out.outside_total_ms = quantile(outside, 0.5);
  const beyond = calls.filter((c) => typeof c.timings.total === "number" && "parse" in c.timings)
    .map((c) => c.ms - c.timings.total - c.timings.parse);
  if (beyond.length) out.outside_server_ms = quantile(beyond, 0.5);
  if (wall_ms !== undefined) {
    out.wall_ms = wall_ms;
    out.calls_per_s = calls.length / (wall_ms / 1000);
  }
  return out;
}
