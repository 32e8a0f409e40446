/**
 * Prometheus text-format metrics: requests by route, method and status; forward latency
 * histogram and forwards by backend; KV-cache bytes and count gauges (read at scrape time).
 * Labels take bounded values only: the route is a route template or "unmatched" (never the
 * path), and a method outside {@link KNOWN_METHODS} is counted as "other", so no client can
 * grow the number of series.
 * @module
 */

/** The methods counted under their own name (RFC 9110 and PATCH); any other is "other". */
export const KNOWN_METHODS: readonly string[] = [
  "GET",
  "HEAD",
  "POST",
  "PUT",
  "DELETE",
  "CONNECT",
  "OPTIONS",
  "TRACE",
  "PATCH",
];

/** A method as a metrics label: itself when known, else "other". */
export function methodLabel(method: string): string {
  return KNOWN_METHODS.includes(method) ? method : "other";
}

/** Upper bounds (seconds) of the forward latency histogram. */
export const LATENCY_BUCKETS = [
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
];

/** Live values read at scrape time. */
export interface MetricsGauges {
  cacheBytes?: () => number;
  cacheCount?: () => number;
  cacheBudgetBytes?: () => number;
}

const esc = (v: string) => v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
const labels = (l: Record<string, string>) =>
  `{${Object.entries(l).map(([k, v]) => `${k}="${esc(v)}"`).join(",")}}`;

/** The service's counters and histograms. */
export class Metrics {
  #requests = new Map<string, { l: Record<string, string>; n: number }>();
  #forwards = new Map<string, number>();
  #hist = new Map<string, { counts: number[]; sum: number; n: number }>();
  #gauges: MetricsGauges;

  constructor(gauges: MetricsGauges = {}) {
    this.#gauges = gauges;
  }

  /**
   * Counts one finished request. `route` is the route template (or "unmatched"); the method
   * is counted through {@link methodLabel}.
   */
  recordRequest(route: string, method: string, status: number): void {
    const l = { route, method: methodLabel(method), status: String(status) };
    const key = JSON.stringify(l);
    const e = this.#requests.get(key);
    if (e) e.n++;
    else this.#requests.set(key, { l, n: 1 });
  }

  /** Counts one successful forward and its latency in seconds. */
  recordForward(backend: string, seconds: number): void {
    this.#forwards.set(backend, (this.#forwards.get(backend) ?? 0) + 1);
    let h = this.#hist.get(backend);
    if (!h) {
      this.#hist.set(
        backend,
        h = { counts: new Array(LATENCY_BUCKETS.length).fill(0), sum: 0, n: 0 },
      );
    }
    for (let i = 0; i < LATENCY_BUCKETS.length; i++) {
      if (seconds <= LATENCY_BUCKETS[i]) h.counts[i]++;
    }
    h.sum += seconds;
    h.n++;
  }

  /** The Prometheus text exposition (version 0.0.4). */
  render(): string {
    const out: string[] = [];
    out.push("# HELP attn_http_requests_total HTTP requests by route, method and status.");
    out.push("# TYPE attn_http_requests_total counter");
    for (const { l, n } of this.#requests.values()) {
      out.push(`attn_http_requests_total${labels(l)} ${n}`);
    }
    out.push("# HELP attn_forwards_total Successful forward calls by backend.");
    out.push("# TYPE attn_forwards_total counter");
    for (const [b, n] of this.#forwards) {
      out.push(`attn_forwards_total${labels({ backend: b })} ${n}`);
    }
    out.push("# HELP attn_forward_duration_seconds Forward call latency by backend.");
    out.push("# TYPE attn_forward_duration_seconds histogram");
    for (const [b, h] of this.#hist) {
      LATENCY_BUCKETS.forEach((le, i) =>
        out.push(
          `attn_forward_duration_seconds_bucket${labels({ backend: b, le: String(le) })} ${
            h.counts[i]
          }`,
        )
      );
      out.push(`attn_forward_duration_seconds_bucket${labels({ backend: b, le: "+Inf" })} ${h.n}`);
      out.push(`attn_forward_duration_seconds_sum${labels({ backend: b })} ${h.sum}`);
      out.push(`attn_forward_duration_seconds_count${labels({ backend: b })} ${h.n}`);
    }
    const g = this.#gauges;
    const gauge = (name: string, help: string, f?: () => number) => {
      if (!f) return;
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, `${name} ${f()}`);
    };
    gauge("attn_kv_cache_bytes", "Bytes held by server-side KV caches.", g.cacheBytes);
    gauge("attn_kv_caches", "Server-side KV caches.", g.cacheCount);
    gauge(
      "attn_kv_cache_budget_bytes",
      "Memory budget for server-side KV caches.",
      g.cacheBudgetBytes,
    );
    return out.join("\n") + "\n";
  }
}
