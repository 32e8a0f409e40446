/**
 * The Prometheus text exposition's building blocks (version 0.0.4), for server/metrics.ts and
 * server/metrics_pools.ts: label sets (values escaped), samples each with its HELP and TYPE
 * lines, and histograms (observed into cumulative buckets, rendered with `+Inf`, sum and count).
 * @module
 */

const esc = (v: string) => v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
/** A label set as the exposition writes it: `{k="v",...}`, each value escaped. */
export const labels = (l: Record<string, string>) =>
  `{${Object.entries(l).map(([k, v]) => `${k}="${esc(v)}"`).join(",")}}`;

/** `[name suffix, type, help, value]` of each sample. */
export type Samples = [string, "gauge" | "counter", string, number][];

/** Samples, each with its HELP and TYPE lines. */
export function samples(out: string[], prefix: string, list: Samples): void {
  for (const [suffix, type, help, v] of list) {
    const name = `${prefix}_${suffix}`;
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, `${name} ${v}`);
  }
}

/** A histogram's counts. */
export interface Histogram {
  counts: number[];
  sum: number;
  n: number;
}

/** Counts `seconds` into `h`, whose counts are those of `buckets` (upper bounds). */
export function observe(h: Histogram, buckets: number[], seconds: number): void {
  for (let i = 0; i < buckets.length; i++) if (seconds <= buckets[i]) h.counts[i]++;
  h.sum += seconds;
  h.n++;
}

/** Histogram `h` of labels `l` as samples `name`_bucket (cumulative), _sum and _count. */
export function renderHistogram(
  out: string[],
  name: string,
  l: Record<string, string>,
  buckets: number[],
  h: Histogram,
): void {
  buckets.forEach((le, i) =>
    out.push(`${name}_bucket${labels({ ...l, le: String(le) })} ${h.counts[i]}`)
  );
  out.push(`${name}_bucket${labels({ ...l, le: "+Inf" })} ${h.n}`);
  out.push(`${name}_sum${labels(l)} ${h.sum}`);
  out.push(`${name}_count${labels(l)} ${h.n}`);
}
