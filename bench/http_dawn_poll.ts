/**
 * Dawn's event-poll ticks as a server's `/metrics` counts them (`attn_dawn_poll_ticks_total`,
 * server/metrics_pools.ts; summed over device threads), so the HTTP bench can say how many of a
 * phase's ticks ran at once and how many as paced timers (gpu/dawn_tick_pace.ts: a wait past
 * `ATTN_DAWN_TICK_SPIN_MS` ms, each paced tick up to a timer late).
 * @module
 */

/** Ticks run at once and as paced timers. */
export interface PollTicks {
  immediate: number;
  paced: number;
}

/** The tick counters in a Prometheus text, summed over its samples; null when it has none. */
export function pollTicksOf(metrics: string): PollTicks | null {
  const t: PollTicks = { immediate: 0, paced: 0 };
  let found = false;
  for (const [, labels, v] of metrics.matchAll(/^attn_dawn_poll_ticks_total\{([^}]*)\} (\S+)$/gm)) {
    const paced = /(?:^|,)paced="true"/.test(labels);
    t[paced ? "paced" : "immediate"] += Number(v);
    found = true;
  }
  return found ? t : null;
}

/** The server's counters now (null: no Dawn there, or /metrics unreadable). */
export async function serverPollTicks(
  url: string,
  headers: Record<string, string>,
): Promise<PollTicks | null> {
  const text = await metricsText(url, headers);
  return text === null ? null : pollTicksOf(text);
}

/** A server's /metrics text now (null: unreadable, or not a 2xx). */
export async function metricsText(
  url: string,
  headers: Record<string, string>,
): Promise<string | null> {
  try {
    const r = await fetch(new URL("/metrics", url), { headers });
    const text = await r.text();
    return r.ok ? text : null;
  } catch {
    return null;
  }
}

/** `after - before`, or null when either is missing. */
export function ticksBetween(before: PollTicks | null, after: PollTicks | null): PollTicks | null {
  if (!before || !after) return null;
  return { immediate: after.immediate - before.immediate, paced: after.paced - before.paced };
}
