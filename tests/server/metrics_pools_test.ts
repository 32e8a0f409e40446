/**
 * The memory pools outside `--memory-budget-bytes` in /metrics: this thread's GPU buffer pools
 * and host read-back pool (free, in-use and cap bytes; buffers created and reused; host leases
 * leaked), its read-backs by how they completed (early, awaited), Dawn's poll ticks (at once, paced), the plan cache where wired (plans, hits, misses, disposed), and the device threads'
 * merge, which gives each of these families one HELP and TYPE and a `device_thread` label a
 * sample.
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import type { AttentionBackend, GpuContext } from "../../core/types.ts";
import { bufferPoolTotals, poolOf } from "../../gpu/buffer_pool.ts";
import { hostPool } from "../../gpu/host_pool.ts";
import { mapReadCounts } from "../../gpu/map_read.ts";
import { dawnTickPacing } from "../../gpu/dawn_tick_pace.ts";
import { createHandler } from "../../server/handler.ts";
import { type MemoryPools, Metrics } from "../../server/metrics.ts";
import { mergeMetrics } from "../../server/metrics_merge.ts";
import { AttentionService } from "../../service/service.ts";
import { FakeNoDevice, startServer } from "./helpers.ts";
import { HeldSeq } from "./held_seq.ts";

const POOLS: MemoryPools = {
  gpu: { free_bytes: 4096, in_use_bytes: 8192, max_free_bytes: 2 ** 30, created: 7, reused: 40 },
  host: {
    free_bytes: 65536,
    in_use_bytes: 0,
    max_free_bytes: 2 ** 28,
    created: 3,
    reused: 12,
    leaked: 1,
  },
  readbacks: { early: 250, awaited: 2, deferred: 240, by_submit: 31 },
};

/** `name value` samples (no labels) of a text, by name. */
function plain(text: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const [, k, v] of text.matchAll(/^(attn_\w+) (\S+)$/gm)) m.set(k, Number(v));
  return m;
}

Deno.test("metrics: the memory pools and the plan cache, with HELP and TYPE", () => {
  const plans = { size: 5, hits: 90, misses: 6, disposed: 1 };
  const text = new Metrics({ memoryPools: () => POOLS, planCache: () => plans }).render();
  const s = plain(text);
  assert.deepEqual(Object.fromEntries([...s].filter(([k]) => /pool|plan_cache|readback/.test(k))), {
    attn_gpu_buffer_pool_free_bytes: 4096,
    attn_gpu_buffer_pool_in_use_bytes: 8192,
    attn_gpu_buffer_pool_max_free_bytes: 2 ** 30,
    attn_gpu_buffer_pool_created_total: 7,
    attn_gpu_buffer_pool_reused_total: 40,
    attn_host_pool_free_bytes: 65536,
    attn_host_pool_in_use_bytes: 0,
    attn_host_pool_max_free_bytes: 2 ** 28,
    attn_host_pool_created_total: 3,
    attn_host_pool_reused_total: 12,
    attn_host_pool_leaked_total: 1,
    attn_gpu_readback_early_total: 250,
    attn_gpu_readback_awaited_total: 2,
    attn_gpu_readback_deferred_total: 240,
    attn_gpu_readback_by_submit_total: 31,
    attn_plan_cache_plans: 5,
    attn_plan_cache_hits_total: 90,
    attn_plan_cache_misses_total: 6,
    attn_plan_cache_disposed_total: 1,
  });
  for (const name of s.keys()) {
    const type = name.endsWith("_total") ? "counter" : "gauge";
    assert.match(text, new RegExp(`^# HELP ${name} \\S`, "m"), name);
    assert.match(text, new RegExp(`^# TYPE ${name} ${type}\n${name} `, "m"), name);
  }
  // Without a plan cache wired, none of its series; `memoryPools: null`, none of the pools'.
  const bare = new Metrics({ memoryPools: null }).render();
  assert.doesNotMatch(bare, /pool|plan_cache|attn_gpu_readback/);
});

Deno.test("metrics: by default, this thread's pools as gpu/ counts them", () => {
  const device = {
    lost: new Promise(() => {}),
    createBuffer: ({ size }: { size: number }) => ({ size, destroy() {} }),
  } as unknown as GPUDevice;
  const pool = poolOf({ device, generation: 1, lost: false } as unknown as GpuContext);
  const b = pool.acquire(3000, 0x80); // 4 KiB class
  const lease = hostPool.acquire(10_000); // 16 KiB class
  try {
    const s = plain(new Metrics().render());
    const g = bufferPoolTotals(), h = hostPool.stats();
    assert.ok(g.in_use_bytes >= 4096);
    assert.equal(s.get("attn_gpu_buffer_pool_in_use_bytes"), g.in_use_bytes);
    assert.equal(s.get("attn_gpu_buffer_pool_free_bytes"), g.free_bytes);
    assert.equal(s.get("attn_gpu_buffer_pool_max_free_bytes"), g.max_free_bytes);
    assert.equal(s.get("attn_gpu_buffer_pool_created_total"), g.created);
    assert.ok(h.in_use_bytes >= 16384);
    assert.equal(s.get("attn_host_pool_in_use_bytes"), h.in_use_bytes);
    assert.equal(s.get("attn_host_pool_max_free_bytes"), hostPool.maxFreeBytes);
    assert.equal(s.get("attn_gpu_readback_early_total"), mapReadCounts.early);
    assert.equal(s.get("attn_gpu_readback_awaited_total"), mapReadCounts.awaited);
    assert.equal(s.get("attn_gpu_readback_deferred_total"), mapReadCounts.deferred);
    assert.equal(s.get("attn_gpu_readback_by_submit_total"), mapReadCounts.by_submit);
  } finally {
    pool.release(b);
    lease.release();
  }
  const after = plain(new Metrics().render());
  assert.equal(after.get("attn_gpu_buffer_pool_in_use_bytes"), bufferPoolTotals().in_use_bytes);
  assert.equal(after.get("attn_host_pool_in_use_bytes"), hostPool.stats().in_use_bytes);
});

Deno.test("metrics: the device threads' merge labels every pool sample by thread", () => {
  const other: MemoryPools = {
    gpu: { ...POOLS.gpu, free_bytes: 0 },
    host: { ...POOLS.host, in_use_bytes: 32768 },
    readbacks: { early: 7, awaited: 1, deferred: 7, by_submit: 0 },
  };
  const plans = { size: 1, hits: 2, misses: 3, disposed: 0 };
  const texts = [POOLS, other].map((p) =>
    new Metrics({ cacheBytes: () => 0, memoryPools: () => p, planCache: () => plans }).render()
  );
  const merged = mergeMetrics(texts);
  for (
    const name of [
      "attn_gpu_buffer_pool_free_bytes",
      "attn_host_pool_in_use_bytes",
      "attn_host_pool_leaked_total",
      "attn_gpu_readback_early_total",
      "attn_plan_cache_hits_total",
    ]
  ) {
    assert.equal(merged.split(`# HELP ${name} `).length, 2, `one HELP of ${name}`);
    assert.equal(merged.split(`# TYPE ${name} `).length, 2, `one TYPE of ${name}`);
  }
  // Each family's samples together, right after its TYPE line, one a thread.
  assert.match(
    merged,
    /^# TYPE attn_gpu_buffer_pool_free_bytes gauge\nattn_gpu_buffer_pool_free_bytes\{device_thread="0"\} 4096\nattn_gpu_buffer_pool_free_bytes\{device_thread="1"\} 0\n/m,
  );
  assert.match(
    merged,
    /^# TYPE attn_host_pool_in_use_bytes gauge\nattn_host_pool_in_use_bytes\{device_thread="0"\} 0\nattn_host_pool_in_use_bytes\{device_thread="1"\} 32768\n/m,
  );
  assert.match(
    merged,
    /^# TYPE attn_plan_cache_plans gauge\nattn_plan_cache_plans\{device_thread="0"\} 1\nattn_plan_cache_plans\{device_thread="1"\} 1\n/m,
  );
  assert.doesNotMatch(merged, /^attn_\w+ /m, "no sample left without its thread");
});

Deno.test("metrics: /metrics of a server shows the pools (the handler's default Metrics too)", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("m", HeldSeq.cacheSpec());
    await srv.client.forwardOn("m", new HeldSeq().step(2).body);
    const s = plain(await (await fetch(`${srv.url}/metrics`)).text());
    assert.equal(s.get("attn_host_pool_max_free_bytes"), hostPool.maxFreeBytes);
    assert.equal(typeof s.get("attn_gpu_buffer_pool_free_bytes"), "number");
  } finally {
    await srv.close();
  }
  // The handler's own Metrics (no `metrics` option), as server/device_setup.ts builds it.
  const service = new AttentionService({
    backends: [CPU_REFERENCE as AttentionBackend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    const res = await createHandler(service)(new Request("http://localhost/metrics"));
    const s = plain(await res.text());
    assert.equal(s.get("attn_host_pool_max_free_bytes"), hostPool.maxFreeBytes);
    assert.equal(s.get("attn_gpu_buffer_pool_max_free_bytes"), bufferPoolTotals().max_free_bytes);
    // The plan cache's series come from the service the handler serves.
    assert.equal(s.get("attn_plan_cache_plans"), service.plans.stats().size);
    assert.equal(s.get("attn_plan_cache_misses_total"), service.plans.stats().misses);
  } finally {
    await service.close();
  }
});

Deno.test("metrics: Dawn's poll ticks, at once and paced, where the pacer is installed", () => {
  const withTicks: MemoryPools = { ...POOLS, dawn_poll: { immediate: 1234, paced: 56 } };
  const text = new Metrics({ memoryPools: () => withTicks }).render();
  assert.match(
    text,
    /^# TYPE attn_dawn_poll_ticks_total counter\nattn_dawn_poll_ticks_total\{paced="false"\} 1234\nattn_dawn_poll_ticks_total\{paced="true"\} 56\n/m,
  );
  assert.match(text, /^# HELP attn_dawn_poll_ticks_total \S/m);
  // Merged over device threads, each thread's pair labelled.
  const merged = mergeMetrics([text, text]);
  assert.match(merged, /attn_dawn_poll_ticks_total\{device_thread="1",paced="true"\} 56\n/);
  // No pacer (Dawn never loaded on the thread): no family.
  assert.doesNotMatch(new Metrics({ memoryPools: () => POOLS }).render(), /dawn_poll/);
});

Deno.test("metrics: by default, the pacer's counts where one is installed on this thread", () => {
  // Installing one here would wrap this process's setImmediate for every later test, so the
  // case follows what this process has: Dawn loaded by an earlier test installs it.
  const stats = dawnTickPacing();
  const s = new Metrics().render();
  if (!stats) return assert.doesNotMatch(s, /attn_dawn_poll_ticks_total/);
  const at = (paced: string) =>
    Number(
      s.match(new RegExp(`^attn_dawn_poll_ticks_total\\{paced="${paced}"\\} (\\d+)$`, "m"))?.[1],
    );
  assert.equal(at("false"), stats.immediate);
  assert.equal(at("true"), stats.paced);
});

Deno.test("metrics: the process's resident set and this thread's V8 heap, live and as given", () => {
  const given = new Metrics({
    memoryPools: () => ({ ...POOLS, memory: { rss: 7e8, heap_used: 2e7, heap_total: 6e7 } }),
  }).render();
  for (
    const [name, v] of [
      ["attn_process_resident_memory_bytes", 7e8],
      ["attn_v8_heap_used_bytes", 2e7],
      ["attn_v8_heap_total_bytes", 6e7],
    ] as const
  ) {
    assert.equal(plain(given).get(name), v, name);
    assert.match(given, new RegExp(`^# HELP ${name} \\S[^\n]*\n# TYPE ${name} gauge\n`, "m"));
  }
  assert.doesNotMatch(new Metrics({ memoryPools: () => POOLS }).render(), /resident|v8_heap/);
  // By default, read at scrape time: each value lies between Deno.memoryUsage() read just before
  // and just after the scrape (a resident set need not grow with a new allocation, since freed
  // pages are reused: CI saw a 64 MiB fill add less than 48 MiB), within 8 MiB of slack.
  // The blocks stay held, so a value read once and kept would fall out of a later bracket.
  const slack = 8 * 2 ** 20;
  const held: Uint8Array[] = [];
  for (let i = 0; i < 3; i++) {
    held.push(new Uint8Array((32 << i) * 2 ** 20).fill(1));
    const lo = Deno.memoryUsage();
    const got = plain(new Metrics().render());
    const hi = Deno.memoryUsage();
    const rss = got.get("attn_process_resident_memory_bytes")!;
    const used = got.get("attn_v8_heap_used_bytes")!;
    assert.ok(rss > 10 * 2 ** 20, `rss ${rss}`);
    assert.ok(rss >= Math.min(lo.rss, hi.rss) - slack && rss <= Math.max(lo.rss, hi.rss) + slack);
    assert.ok(used > 0 && got.get("attn_v8_heap_total_bytes")! >= used);
    const [u0, u1] = [lo.heapUsed, hi.heapUsed].sort((a, b) => a - b);
    assert.ok(used >= u0 - slack && used <= u1 + slack, `heap used ${used}: ${u0}..${u1}`);
  }
  assert.ok(held.every((b) => b[b.length - 1] === 1));
});

/** Spins this thread for `ms` of wall time. */
function spin(ms: number): number {
  const end = performance.now() + ms;
  let x = 0;
  while (performance.now() < end) x += Math.sqrt(x + 1);
  return x;
}

Deno.test("metrics: this thread's and the process's CPU seconds, live and as given", async () => {
  const given = new Metrics({
    memoryPools: () => ({ ...POOLS, cpu: { thread: 1.25, process: 3.5 } }),
  }).render();
  for (
    const [name, v] of [
      ["attn_thread_cpu_seconds_total", 1.25],
      ["attn_process_cpu_seconds_total", 3.5],
    ] as const
  ) {
    assert.equal(plain(given).get(name), v, name);
    assert.match(given, new RegExp(`^# HELP ${name} \\S[^\n]*\n# TYPE ${name} counter\n`, "m"));
  }
  assert.doesNotMatch(new Metrics({ memoryPools: () => POOLS }).render(), /cpu_seconds/);
  if (Deno.build.os !== "linux") return;
  // Live: 300 ms of this thread's busy work adds about as much to both (at least 150 ms: the
  // thread may be preempted on a busy host; never more than the wall time and a 10 ms tick).
  const read = () => plain(new Metrics().render());
  const a = read(), w0 = performance.now();
  spin(300);
  const b = read(), wall = (performance.now() - w0) / 1e3;
  const dThread = b.get("attn_thread_cpu_seconds_total")! -
    a.get("attn_thread_cpu_seconds_total")!;
  const dProcess = b.get("attn_process_cpu_seconds_total")! -
    a.get("attn_process_cpu_seconds_total")!;
  assert.ok(dThread >= 0.15 && dThread <= wall + 0.02, `thread ${dThread} s over ${wall} s`);
  assert.ok(dProcess >= 0.1, `process ${dProcess} s`);
  // A sleeping thread's count stands still (a value that were the process's would not: the
  // worker below spins meanwhile), and the worker's own scrape counts its spin, not ours.
  const src = `import { Metrics } from ${
    JSON.stringify(import.meta.resolve("../../server/metrics.ts"))
  };
    const read = (name) =>
      Number(new Metrics().render().match(new RegExp("^" + name + " (\\\\S+)$", "m"))[1]);
    const t0 = read("attn_thread_cpu_seconds_total"), end = performance.now() + 300;
    let x = 0; while (performance.now() < end) x += Math.sqrt(x + 1);
    self.postMessage(read("attn_thread_cpu_seconds_total") - t0);`;
  const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
  const worker = new Worker(url, { type: "module" });
  try {
    const c = read();
    const workerSpin = await new Promise<number>((res, rej) => {
      worker.onmessage = (e) => res(e.data);
      worker.onerror = (e) => rej(e.message);
    });
    const d = read();
    const ours = d.get("attn_thread_cpu_seconds_total")! - c.get("attn_thread_cpu_seconds_total")!;
    assert.ok(workerSpin >= 0.15, `worker ${workerSpin} s`);
    assert.ok(ours < 0.1, `this thread ${ours} s while it waited for the worker`);
  } finally {
    worker.terminate();
    URL.revokeObjectURL(url);
  }
});
