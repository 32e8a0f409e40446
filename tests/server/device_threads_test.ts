/**
 * `--device-threads 2` end to end, on real server processes (`--no-gpu`: each thread's
 * service runs CPU_REFERENCE; on a machine with a WebGPU adapter, one run on it too): caches
 * created by POST and by PUT spread over both threads (the merged /metrics counts them per
 * `device_thread`), every route of a cache reaches the thread that holds it (path forward,
 * `POST /v1/attention/forward` naming the cache in a JSON body and in a safetensors body, GET,
 * DELETE) with answers matching float64, a deleted cache is gone, calls on caches of both
 * threads at once keep their answers apart, SIGTERM drains and exits 0, the flag refuses
 * `--http-workers` beside it; and in process, a thread that crashes answers 503
 * `device_thread_lost` for its caches while the other thread goes on.
 */
import assert from "node:assert/strict";
import { AttentionApiError, AttentionClient } from "../../client/client.ts";
import { HeldSeq } from "./held_seq.ts";
import { maxAbsDiff } from "./helpers.ts";
import { runServerToExit, spawnServer } from "./process.ts";
import { NO_GPU } from "../gpu/helpers.ts";
import { SERVE_RUNTIME } from "../support/gpu.ts";
import { frontCaller, startNoGpuThreads } from "./no_gpu_threads.ts";

/** attn_kv_caches per device thread, from the merged /metrics. */
async function cachesPerThread(url: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^attn_kv_caches\{device_thread="(\d+)"\} (\d+)$/gm)) {
    out[m[1]] = Number(m[2]);
  }
  return out;
}

/** Each device thread's free budget bytes, from its budget and cache-bytes gauges. */
async function freePerThread(url: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const per = (name: string) =>
    Object.fromEntries(
      [...text.matchAll(new RegExp(`^${name}\\{device_thread="(\\d+)"\\} (\\d+)$`, "gm"))]
        .map((m) => [m[1], Number(m[2])]),
    );
  const budget = per("attn_kv_cache_budget_bytes"), used = per("attn_kv_cache_bytes");
  assert.equal(Object.keys(budget).length, 2, text);
  return Object.fromEntries(Object.entries(budget).map(([t, b]) => [t, b - used[t]]));
}

/** Three steps on cache `id`, one per route, each against float64. */
async function stepsOn(api: AttentionClient, id: string, seq: HeldSeq): Promise<void> {
  const a = seq.step(3);
  const r1 = await api.forwardOn(id, a.body);
  assert.ok(maxAbsDiff(r1.output.values, a.ref) < 2e-5, `${id}: path route`);
  const b = seq.step(1);
  const r2 = await api.forward({ ...b.body, kv_cache: id });
  assert.ok(maxAbsDiff(r2.output.values, b.ref) < 2e-5, `${id}: JSON body naming the cache`);
  const c = seq.step(2);
  const r3 = await api.forward({ ...c.body, kv_cache: id }, { binary: true });
  assert.ok(maxAbsDiff(r3.output.values, c.ref) < 2e-5, `${id}: safetensors body naming it`);
}

async function routesSuite(
  args: readonly string[],
  device: RegExp,
  perms: readonly string[] = [],
): Promise<void> {
  const srv = await spawnServer(["--device-threads", "2", ...args], {}, perms);
  try {
    assert.match(srv.stderr(), /device threads: 2/);
    for (const t of [0, 1]) {
      assert.match(srv.stderr(), new RegExp(`device thread ${t}: ${device.source}`));
    }
    const api = new AttentionClient(srv.url);
    const posted = [
      (await api.createCache(HeldSeq.cacheSpec())).id,
      (await api.createCache(HeldSeq.cacheSpec())).id,
    ];
    for (const id of ["put-a", "put-b"]) await api.putCache(id, HeldSeq.cacheSpec());
    assert.deepEqual(await cachesPerThread(srv.url), { "0": 2, "1": 2 });
    // A refused PUT of a new id leaves no cache behind, on the thread or in the front's count.
    await assert.rejects(
      api.putCache("bad", { ...HeldSeq.cacheSpec(), num_blocks: 0 }),
      (e) => e instanceof AttentionApiError && e.status >= 400 && e.status < 500,
    );
    await api.putCache("put-c", HeldSeq.cacheSpec());
    assert.deepEqual(await cachesPerThread(srv.url), { "0": 3, "1": 2 });
    await api.deleteCache("put-c");
    const ids = [...posted, "put-a", "put-b"];
    const seqs = ids.map(() => new HeldSeq());
    // All four at once: two threads, two caches each.
    await Promise.all(ids.map((id, i) => stepsOn(api, id, seqs[i])));
    // One at a time (nothing else in flight to steer the choice of thread).
    for (const [i, id] of ids.entries()) await stepsOn(api, id, seqs[i]);
    for (const id of ids) assert.equal((await api.getCache(id)).id, id);
    await api.deleteCache("put-a");
    const left = Object.values(await cachesPerThread(srv.url)).sort();
    assert.deepEqual(left, [1, 2], "one thread lost its cache");
    await assert.rejects(
      api.forward({ ...seqs[2].step(1).body, kv_cache: "put-a" }),
      (e) => e instanceof AttentionApiError && e.status === 404,
    );
    // The id comes back on the thread with fewer caches.
    await api.putCache("put-a", HeldSeq.cacheSpec());
    assert.deepEqual(await cachesPerThread(srv.url), { "0": 2, "1": 2 });
    await stepsOn(api, "put-a", new HeldSeq());
    // /metrics: a HEAD has the merged GET's length, and each scrape counts once (not once a
    // thread).
    const scrapes = async () => {
      const text = await (await fetch(`${srv.url}/metrics`)).text();
      const series = [...text.matchAll(
        /^attn_http_requests_total\{[^}]*route="\/metrics"[^}]*\} (\d+)$/gm,
      )];
      return { text, count: series.reduce((a, m) => a + Number(m[1]), 0) };
    };
    const before = await scrapes();
    const head = await fetch(`${srv.url}/metrics`, { method: "HEAD" });
    const after = await scrapes();
    assert.equal(after.count - before.count, 2, "the HEAD and this GET, once each");
    const heads = [...after.text.matchAll(/^attn_http_requests_total\{([^}]*)\} (\d+)$/gm)]
      .filter((m) => m[1].includes('route="/metrics"') && m[1].includes('method="HEAD"'));
    assert.equal(heads.reduce((a, m) => a + Number(m[2]), 0), 1, "the HEAD counted as a HEAD");
    const len = Number(head.headers.get("content-length"));
    assert.ok(Math.abs(len - before.text.length) < 64, `HEAD ${len} vs GET ${before.text.length}`);
    assert.match(before.text, /device_thread="1"/, "the merged series");
    srv.kill("SIGTERM");
    const end = await srv.exited;
    assert.equal(end.code, 0, end.stderr);
    assert.match(end.stderr, /stopped: every call finished/);
    // Only thread 0 probes the runtime not chosen (Dawn is not loaded in every thread for it):
    // thread 1 says which device it has, nothing more.
    const lines = end.stderr.split("\n").filter((l) => l.startsWith("device thread 1: webgpu:"));
    assert.equal(lines.length, 1, lines.join("\n"));
  } finally {
    srv.kill("SIGKILL");
    await srv.exited;
  }
}

Deno.test("device threads: caches spread, routes reach their holder (no GPU)", async () => {
  await routesSuite(["--no-gpu"], /webgpu: disabled/);
});

Deno.test("device threads: the same on WebGPU, a device a thread", { ignore: NO_GPU }, async () => {
  // The suite's runtime (Dawn needs --allow-ffi; the server would read ATTN_WEBGPU_RUNTIME).
  await routesSuite(SERVE_RUNTIME.args, /webgpu: (deno|dawn) /, SERVE_RUNTIME.perms);
});

Deno.test("device threads: not with --http-workers", async () => {
  const r = await runServerToExit(["--device-threads", "2", "--http-workers", "2", "--no-gpu"]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--http-workers \(2\) and --device-threads \(2\) exclude each other/);
});

Deno.test("device threads: a thread that stops takes its caches, the others go on", async () => {
  const front = await startNoGpuThreads(2);
  const call = frontCaller(front);
  try {
    // Creates sent together spread (the ones in flight count).
    const created = await Promise.all(
      [0, 1, 2, 3].map(() => call("POST", "/v1/kv-caches", HeldSeq.cacheSpec())),
    );
    assert.deepEqual(created.map((r) => r.status), [201, 201, 201, 201]);
    const ids: string[] = await Promise.all(created.map(async (r) => (await r.json()).id));
    const perThread = async () =>
      [...(await (await call("GET", "/metrics")).text()).matchAll(
        /^attn_kv_caches\{device_thread="(\d+)"\} (\d+)$/gm,
      )].map((m) => `${m[1]}:${m[2]}`).join(" ");
    assert.equal(await perThread(), "0:2 1:2");
    front.fault(1);
    await new Promise((r) => setTimeout(r, 200));
    const got = await Promise.all(ids.map((id) => call("GET", `/v1/kv-caches/${id}`)));
    const alive = ids.filter((_, i) => got[i].status === 200);
    const lost = got.filter((r) => r.status === 503);
    assert.equal(alive.length, 2);
    assert.equal(lost.length, 2);
    for (const r of lost) assert.equal((await r.json()).code, "device_thread_lost");
    ids.splice(0, ids.length, ...alive);
    const seq = new HeldSeq();
    const step = seq.step(2);
    const res = await call("POST", "/v1/attention/forward", { ...step.body, kv_cache: ids[0] });
    assert.equal(res.status, 200);
    const out = (await res.json()).output;
    assert.ok(maxAbsDiff(out.data, step.ref) < 2e-5);
    // New caches go to the thread that still runs (a lost one is never chosen), and /metrics has
    // its series only (2 + 3 caches).
    for (let i = 0; i < 3; i++) {
      const again = await call("POST", "/v1/kv-caches", HeldSeq.cacheSpec());
      assert.equal(again.status, 201);
      assert.equal((await call("GET", `/v1/kv-caches/${(await again.json()).id}`)).status, 200);
    }
    const text = await (await call("GET", "/metrics")).text();
    assert.match(text, /^attn_kv_caches\{device_thread="0"\} 5$/m);
    // Its series are gone; only the front's gauge names it, as down.
    const named = text.split("\n").filter((l) => l.includes('device_thread="1"'));
    assert.deepEqual(named, ['attn_device_thread_up{device_thread="1"} 0']);
    assert.equal((await call("GET", "/healthz")).status, 200);
  } finally {
    await front.close();
  }
});

Deno.test("device threads: a create one thread has no room for goes to one that has", async () => {
  // 256 bytes a block (HeldSeq's spec); the budget 4096 bytes, 2048 a thread.
  const spec = (num_blocks: number) => ({ ...HeldSeq.cacheSpec(), num_blocks });
  const srv = await spawnServer([
    "--no-gpu",
    "--device-threads",
    "2",
    "--memory-budget-bytes",
    "4096",
  ]);
  try {
    const api = new AttentionClient(srv.url);
    await api.putCache("a", spec(1)); // thread 0
    await api.putCache("big", spec(7)); // thread 1: 256 bytes left
    await api.putCache("b", spec(1)); // thread 0: two caches, 1536 bytes left
    // Thread 1 holds fewer caches, but has no room for 1024 bytes: thread 0 takes it.
    await api.putCache("m", spec(4));
    assert.deepEqual(await cachesPerThread(srv.url), { "0": 3, "1": 1 });
    assert.equal((await api.getCache("m")).num_blocks, 4);
    await api.deleteCache("m");
    const posted = await api.createCache(spec(4)); // the same through POST
    assert.equal((await api.getCache(posted.id)).num_blocks, 4);
    assert.deepEqual(await cachesPerThread(srv.url), { "0": 3, "1": 1 });
    // Room on no thread: the refusal says the budget is split.
    for (const make of [() => api.putCache("huge", spec(6)), () => api.createCache(spec(6))]) {
      const e = await make().then(() => null, (x) => x);
      assert.ok(e instanceof AttentionApiError, String(e));
      assert.equal(e.status, 422);
      assert.equal(e.code, "memory_budget_exceeded");
      assert.equal(e.problem.device_threads, 2);
      assert.match(e.problem.detail, /each of the 2 device threads holds 1\/2/);
      // The most any thread had left, not the last one asked's (an audit saw the smaller).
      const largest = e.problem.largest_remaining_bytes as number;
      assert.match(e.problem.detail, new RegExp(`the most any has left: ${largest} bytes`));
      assert.ok(largest >= (e.problem.remaining_bytes as number), JSON.stringify(e.problem));
      assert.equal(largest, Math.max(...Object.values(await freePerThread(srv.url))));
    }
    assert.deepEqual(await cachesPerThread(srv.url), { "0": 3, "1": 1 }, "nothing left behind");
    await assert.rejects(api.getCache("huge"), /404/);
    // Each answer the client got is counted once, with its status: a refusal the front retried
    // on the other thread is not (each thread counted every attempt: 422s nobody saw).
    const text = await (await fetch(`${srv.url}/metrics`)).text();
    const count = (route: string, method: string, status: number) =>
      [...text.matchAll(/^attn_http_requests_total\{([^}]*)\} (\d+)$/gm)]
        .filter((m) =>
          m[1].includes(`route="${route}"`) && m[1].includes(`method="${method}"`) &&
          m[1].includes(`status="${status}"`)
        )
        .reduce((a, m) => a + Number(m[2]), 0);
    assert.deepEqual(
      [count("/v1/kv-caches/:id", "PUT", 201), count("/v1/kv-caches/:id", "PUT", 422)],
      [4, 1],
      "PUT a, big, b, m created; huge refused",
    );
    assert.deepEqual(
      [count("/v1/kv-caches", "POST", 201), count("/v1/kv-caches", "POST", 422)],
      [1, 1],
      "one POST created, one refused",
    );
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
  }
});
