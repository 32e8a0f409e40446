/**
 * The memory pools and the plan cache as /metrics shows them: the memory pools outside
 * `--memory-budget-bytes` (this thread's GPU buffer pools, gpu/buffer_pool.ts, and its host
 * read-back pool, gpu/host_pool.ts: free, in-use and cap bytes, buffers created and reused; its
 * read-backs by how they completed, Dawn's poll ticks, the process's resident set and this
 * thread's V8 heap, this thread's and the process's CPU seconds), read at scrape time, and the
 * plan cache's counters (plans held, hits, misses, disposed). server/metrics.ts renders them
 * after its own counters.
 * @module
 */
import { bufferPoolTotals } from "../gpu/buffer_pool.ts";
import { hostPool } from "../gpu/host_pool.ts";
import { mapReadCounts } from "../gpu/map_read.ts";
import { dawnTickPacing } from "../gpu/dawn_tick_pace.ts";
import { labels, type Samples, samples } from "./metrics_text.ts";
import { type CpuSeconds, cpuSeconds } from "./thread_cpu.ts";

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
  /** CPU seconds of this thread and of the process (server/thread_cpu.ts); absent where unread. */
  cpu?: CpuSeconds;
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
    ...threadCpu(),
  };
}

function threadCpu(): Pick<MemoryPools, "cpu"> {
  const cpu = cpuSeconds();
  return cpu ? { cpu } : {};
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

/**
 * The pools' samples: `attn_gpu_buffer_pool_*`, `attn_host_pool_*`, `attn_gpu_readback_*`, the
 * process's and V8's memory where read, and Dawn's poll ticks where counted.
 */
export function renderPools(out: string[], p: MemoryPools): void {
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
      "Read-backs read when mapAsync resolved (Dawn; on Deno's runtime each buffer's first, " +
      "or a fallback).",
      p.readbacks.awaited,
    ],
    [
      "deferred_total",
      "counter",
      "Read-backs deferred one turn so that the thread's other ready calls ran first " +
      "(Deno's runtime).",
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
  if (p.cpu) {
    samples(out, "attn", [
      [
        "thread_cpu_seconds_total",
        "counter",
        "User and system CPU seconds of the thread that rendered these samples.",
        p.cpu.thread,
      ],
      [
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU seconds of the whole process (every thread reports it).",
        p.cpu.process,
      ],
    ]);
  }
  if (!p.dawn_poll) return;
  const name = "attn_dawn_poll_ticks_total";
  out.push(
    `# HELP ${name} Dawn event-poll ticks by whether they ran at once or as paced timers ` +
      "(a wait past ATTN_DAWN_TICK_SPIN_MS: each such tick can find the GPU done up to a timer " +
      "late).",
    `# TYPE ${name} counter`,
    `${name}${labels({ paced: "false" })} ${p.dawn_poll.immediate}`,
    `${name}${labels({ paced: "true" })} ${p.dawn_poll.paced}`,
  );
}

/** The plan cache's samples (`attn_plan_cache_*`). */
export function renderPlanCache(out: string[], c: PlanCacheGauges): void {
  samples(out, "attn_plan_cache", [
    ["plans", "gauge", "Plans held by the plan cache.", c.size],
    ["hits_total", "counter", "Plan-cache lookups that found a plan.", c.hits],
    ["misses_total", "counter", "Plan-cache lookups that built a plan.", c.misses],
    ["disposed_total", "counter", "Plans the plan cache disposed of.", c.disposed],
  ]);
}
