/**
 * Prometheus text-format metrics: requests by route, method and status, and problem answers by
 * route, status and code (the service's own codes: a fixed set); forward latency
 * histogram and forwards by backend; per-phase latency histograms of forward calls by backend
 * and phase ({@link FORWARD_PHASES}); KV-cache bytes and count gauges (read at scrape time); the
 * memory pools outside `--memory-budget-bytes` (this thread's GPU buffer pools, gpu/buffer_pool.ts,
 * and its host read-back pool, gpu/host_pool.ts: free, in-use and cap bytes, buffers created and
 * reused) and, where wired, the plan cache (plans held, hits, misses, disposed). With device
 * threads each thread renders its own and metrics_merge.ts labels them `device_thread`.
 * Labels take bounded values only: the route is a route template or "unmatched" (never the
 * path), and a method outside {@link KNOWN_METHODS} is counted as "other", so no client can
 * grow the number of series.
 *
 * The pools and the plan cache are read and rendered by server/metrics_pools.ts, and the text
 * format's labels, samples and histograms are server/metrics_text.ts's; this module keeps the
 * counters and renders the whole.
 * @module
 */
import { type Histogram, labels, observe, renderHistogram } from "./metrics_text.ts";
import {
  type MemoryPools,
  type PlanCacheGauges,
  renderPlanCache,
  renderPools,
  threadMemoryPools,
} from "./metrics_pools.ts";

export {
  type MemoryPools,
  type PlanCacheGauges,
  type PoolGauges,
  threadMemoryPools,
} from "./metrics_pools.ts";

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

/** Finer upper bounds (seconds) for the per-phase histograms: 50 µs to 10 s. */
export const PHASE_BUCKETS = [
  0.00005,
  0.0001,
  0.00025,
  0.0005,
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
  10,
];

/**
 * The forward phases counted, by their key in a forward's `timings` (milliseconds). The server
 * measures `parse` (read and decode the body) and `encode_response`; the service `validate`,
 * `plan` and `total` (validate to result); GPU backends `encode` (upload and command encoding),
 * `gpu_and_readback` (submit to results on the host) and `gpu` (device time, where timestamp
 * queries exist); CPU_REFERENCE `queue` (waiting for a worker), `write` and `attend`. Other keys
 * are not counted, so the phase label stays bounded.
 */
export const FORWARD_PHASES = [
  "parse",
  "validate",
  "plan",
  "queue",
  "encode",
  "write",
  "attend",
  "gpu",
  "gpu_and_readback",
  "encode_response",
  "total",
] as const;

/** Live values read at scrape time. */
export interface MetricsGauges {
  cacheBytes?: () => number;
  cacheCount?: () => number;
  cacheBudgetBytes?: () => number;
  /** The memory pools (default {@link threadMemoryPools}; null: none shown). */
  memoryPools?: (() => MemoryPools) | null;
  /** The plan cache's counters (e.g. `() => service.plans.stats()`); none shown without. */
  planCache?: () => PlanCacheGauges;
}

/** Adds one to the counter of labels `l` in `m`. */
function count(
  m: Map<string, { l: Record<string, string>; n: number }>,
  l: Record<string, string>,
) {
  const key = JSON.stringify(l);
  const e = m.get(key);
  if (e) e.n++;
  else m.set(key, { l, n: 1 });
}

/** The Prometheus text exposition's media type (version 0.0.4). */
export const METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

/** The service's counters and histograms. */
export class Metrics {
  #requests = new Map<string, { l: Record<string, string>; n: number }>();
  #problems = new Map<string, { l: Record<string, string>; n: number }>();
  #forwards = new Map<string, number>();
  #hist = new Map<string, Histogram>();
  #inFlight = 0;
  #phases = new Map<string, { l: Record<string, string>; h: Histogram }>();
  #gauges: MetricsGauges;

  constructor(gauges: MetricsGauges = {}) {
    this.#gauges = gauges;
  }

  /** A request reached the handler (`attn_http_requests_in_flight` until {@link requestEnded}). */
  requestStarted(): void {
    this.#inFlight++;
  }

  /** The handler answered a request {@link requestStarted} counted (its head, or a failure). */
  requestEnded(): void {
    this.#inFlight--;
  }

  /**
   * Counts one finished request. `route` is the route template (or "unmatched"); the method
   * is counted through {@link methodLabel}.
   */
  recordRequest(route: string, method: string, status: number, code?: string): void {
    const l = { route, method: methodLabel(method), status: String(status) };
    count(this.#requests, l);
    // A problem's code tells apart what its status lumps together (a 503 queue_timeout from a
    // device_unavailable); codes are the service's own, a fixed set.
    if (code !== undefined) count(this.#problems, { route, status: String(status), code });
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
    observe(h, LATENCY_BUCKETS, seconds);
  }

  /**
   * Counts one successful forward's phases: `timings` in milliseconds by phase (a forward's
   * `timings` plus the server's own); keys outside {@link FORWARD_PHASES} and non-finite values
   * are skipped. `backend` is a registered backend's name (a bounded set).
   */
  recordPhases(backend: string, timings: Record<string, number>): void {
    for (const phase of FORWARD_PHASES) {
      const ms = timings[phase];
      if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) continue;
      const key = `${backend}\u0000${phase}`;
      let e = this.#phases.get(key);
      if (!e) {
        e = {
          l: { backend, phase },
          h: { counts: new Array(PHASE_BUCKETS.length).fill(0), sum: 0, n: 0 },
        };
        this.#phases.set(key, e);
      }
      observe(e.h, PHASE_BUCKETS, ms / 1000);
    }
  }

  /** The Prometheus text exposition (version 0.0.4). */
  render(): string {
    const out: string[] = [];
    out.push("# HELP attn_http_requests_total HTTP requests by route, method and status.");
    out.push("# TYPE attn_http_requests_total counter");
    for (const { l, n } of this.#requests.values()) {
      out.push(`attn_http_requests_total${labels(l)} ${n}`);
    }
    out.push("# HELP attn_http_problems_total Problem answers by route, status and code.");
    out.push("# TYPE attn_http_problems_total counter");
    for (const { l, n } of this.#problems.values()) {
      out.push(`attn_http_problems_total${labels(l)} ${n}`);
    }
    out.push("# HELP attn_forwards_total Successful forward calls by backend.");
    out.push("# TYPE attn_forwards_total counter");
    for (const [b, n] of this.#forwards) {
      out.push(`attn_forwards_total${labels({ backend: b })} ${n}`);
    }
    out.push("# HELP attn_forward_duration_seconds Forward call latency by backend.");
    out.push("# TYPE attn_forward_duration_seconds histogram");
    for (const [b, h] of this.#hist) {
      renderHistogram(out, "attn_forward_duration_seconds", { backend: b }, LATENCY_BUCKETS, h);
    }
    out.push(
      "# HELP attn_forward_phase_seconds Forward call phases by backend and phase (parse, " +
        "validate, plan, queue, encode, write, attend, gpu, gpu_and_readback, encode_response, " +
        "total).",
    );
    out.push("# TYPE attn_forward_phase_seconds histogram");
    for (const { l, h } of this.#phases.values()) {
      renderHistogram(out, "attn_forward_phase_seconds", l, PHASE_BUCKETS, h);
    }
    const g = this.#gauges;
    const gauge = (name: string, help: string, f?: () => number) => {
      if (!f) return;
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, `${name} ${f()}`);
    };
    gauge(
      "attn_http_requests_in_flight",
      "HTTP requests the handler is working on, this scrape included (until each answer's head).",
      () => this.#inFlight,
    );
    gauge("attn_kv_cache_bytes", "Bytes held by server-side KV caches.", g.cacheBytes);
    gauge("attn_kv_caches", "Server-side KV caches.", g.cacheCount);
    gauge(
      "attn_kv_cache_budget_bytes",
      "Memory budget for server-side KV caches.",
      g.cacheBudgetBytes,
    );
    const pools = g.memoryPools === undefined ? threadMemoryPools : g.memoryPools;
    if (pools) renderPools(out, pools());
    if (g.planCache) renderPlanCache(out, g.planCache());
    return out.join("\n") + "\n";
  }
}
