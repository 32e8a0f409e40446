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
 * @module
 */
import { bufferPoolTotals } from "../gpu/buffer_pool.ts";
import { hostPool } from "../gpu/host_pool.ts";
import { mapReadCounts } from "../gpu/map_read.ts";
import { dawnTickPacing } from "../gpu/dawn_tick_pace.ts";

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

/** A histogram's counts. */
interface Histogram {
  counts: number[];
  sum: number;
  n: number;
}

function observe(h: Histogram, buckets: number[], seconds: number): void {
  for (let i = 0; i < buckets.length; i++) if (seconds <= buckets[i]) h.counts[i]++;
  h.sum += seconds;
  h.n++;
}

function renderHistogram(
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

/** One memory pool as /metrics shows it. */
export interface PoolGauges {
  free_bytes: number;
  in_use_bytes: number;
  /** The cap on free bytes (free buffers past it are dropped, largest first). */
  max_free_bytes: number;
  /** Buffers ever created and acquires served from the pool (counters). */
  created: number;
  reused: number;
}

/** The memory pools outside the memory budget, read at scrape time. */
export interface MemoryPools {
  /** This thread's GPU buffer pools, summed over its live devices. */
  gpu: PoolGauges;
  /** This thread's host read-back pool, with the leases the garbage collector found unreleased. */
  host: PoolGauges & { leaked: number };
  /** This thread's forward read-backs by how they completed (gpu/map_read.ts). */
  readbacks: { early: number; awaited: number; deferred: number; by_submit: number };
  /**
   * Dawn's event-poll ticks on this thread (gpu/dawn_tick_pace.ts), run at once or paced as
   * timers; absent where the pacer is not installed (Dawn never loaded here).
   */
  dawn_poll?: { immediate: number; paced: number };
  /**
   * The process's resident set and this thread's V8 heap (Deno.memoryUsage()); absent where not
   * read. Under Dawn the resident set grows by about 0.5 KB a forward call that no heap or pool
   * here shows (bench/NOTES.md v0.33: Deno 2.9.6's Node-API layer frees neither its per-object
   * wrappers nor its per-callback blocks).
   */
  memory?: { rss: number; heap_used: number; heap_total: number };
}

/** The pools of this thread (gpu/buffer_pool.ts, gpu/host_pool.ts). */
export function threadMemoryPools(): MemoryPools {
  const g = bufferPoolTotals(), h = hostPool.stats();
  return {
    gpu: g,
    host: {
      free_bytes: h.free_bytes,
      in_use_bytes: h.in_use_bytes,
      max_free_bytes: hostPool.maxFreeBytes,
      created: h.created,
      reused: h.reused,
      leaked: h.leaked,
    },
    readbacks: { ...mapReadCounts },
    ...dawnPoll(),
    memory: processMemory(),
  };
}

function processMemory(): MemoryPools["memory"] {
  const m = Deno.memoryUsage();
  return { rss: m.rss, heap_used: m.heapUsed, heap_total: m.heapTotal };
}

function dawnPoll(): Pick<MemoryPools, "dawn_poll"> {
  const ticks = dawnTickPacing();
  return ticks ? { dawn_poll: { immediate: ticks.immediate, paced: ticks.paced } } : {};
}

/** The plan cache's counters (service/plan_cache.ts PlanCacheStats). */
export interface PlanCacheGauges {
  size: number;
  hits: number;
  misses: number;
  disposed: number;
}

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

const esc = (v: string) => v.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
const labels = (l: Record<string, string>) =>
  `{${Object.entries(l).map(([k, v]) => `${k}="${esc(v)}"`).join(",")}}`;

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
        "validate, plan, queue, encode, write, attend, gpu, gpu_and_readback, encode_response, total).",
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

/** `[name suffix, type, help, value]` of each sample. */
type Samples = [string, "gauge" | "counter", string, number][];

/** Samples, each with its HELP and TYPE lines. */
function samples(out: string[], prefix: string, list: Samples): void {
  for (const [suffix, type, help, v] of list) {
    const name = `${prefix}_${suffix}`;
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, `${name} ${v}`);
  }
}

function renderPools(out: string[], p: MemoryPools): void {
  const outside = "outside the KV-cache memory budget";
  const pool = (what: string, s: PoolGauges): Samples => [
    ["free_bytes", "gauge", `Bytes kept free by the ${what}, ${outside}.`, s.free_bytes],
    ["in_use_bytes", "gauge", `Bytes in use from the ${what}, ${outside}.`, s.in_use_bytes],
    ["max_free_bytes", "gauge", `Cap on the free bytes of the ${what}.`, s.max_free_bytes],
    ["created_total", "counter", `Buffers created by the ${what}.`, s.created],
    ["reused_total", "counter", `Acquires served from the ${what}.`, s.reused],
  ];
  samples(
    out,
    "attn_gpu_buffer_pool",
    pool("GPU buffer pool (summed over this thread's devices)", p.gpu),
  );
  samples(out, "attn_host_pool", [
    ...pool("host read-back pool", p.host),
    [
      "leaked_total",
      "counter",
      "Read-back leases the garbage collector found unreleased.",
      p.host.leaked,
    ],
  ]);
  samples(out, "attn_gpu_readback", [
    [
      "early_total",
      "counter",
      "Read-backs read as soon as the GPU was done (Deno's runtime, without its 10 ms sleep).",
      p.readbacks.early,
    ],
    [
      "awaited_total",
      "counter",
      "Read-backs read when mapAsync resolved (Dawn; on Deno's runtime each buffer's first, or a fallback).",
      p.readbacks.awaited,
    ],
    [
      "deferred_total",
      "counter",
      "Read-backs deferred one turn so that the thread's other ready calls ran first (Deno's runtime).",
      p.readbacks.deferred,
    ],
    [
      "by_submit_total",
      "counter",
      "Deferred read-backs a later call mapped before its own launch (Deno's runtime).",
      p.readbacks.by_submit,
    ],
  ]);
  if (p.memory) {
    samples(out, "attn", [
      [
        "process_resident_memory_bytes",
        "gauge",
        "The whole process's resident set (every thread reports it).",
        p.memory.rss,
      ],
      ["v8_heap_used_bytes", "gauge", "This thread's V8 heap in use.", p.memory.heap_used],
      ["v8_heap_total_bytes", "gauge", "This thread's V8 heap committed.", p.memory.heap_total],
    ]);
  }
  if (!p.dawn_poll) return;
  const name = "attn_dawn_poll_ticks_total";
  out.push(
    `# HELP ${name} Dawn event-poll ticks by whether they ran at once or as paced timers ` +
      "(a wait past ATTN_DAWN_TICK_SPIN_MS: each such tick can find the GPU done up to a timer late).",
    `# TYPE ${name} counter`,
    `${name}${labels({ paced: "false" })} ${p.dawn_poll.immediate}`,
    `${name}${labels({ paced: "true" })} ${p.dawn_poll.paced}`,
  );
}

function renderPlanCache(out: string[], c: PlanCacheGauges): void {
  samples(out, "attn_plan_cache", [
    ["plans", "gauge", "Plans held by the plan cache.", c.size],
    ["hits_total", "counter", "Plan-cache lookups that found a plan.", c.hits],
    ["misses_total", "counter", "Plan-cache lookups that built a plan.", c.misses],
    ["disposed_total", "counter", "Plans the plan cache disposed of.", c.disposed],
  ]);
}
