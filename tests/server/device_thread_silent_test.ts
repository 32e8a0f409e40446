/**
 * A device thread that stops without an error event (`--device-threads`): one that ends (its
 * event loop done, or `self.close()`: Deno's Worker has no exit event) or whose JS thread blocks.
 * Before the front's liveness ping (server/thread_watchdog.ts) a call routed to such a thread,
 * `/healthz` and `/metrics` waited without end, new caches were placed on it, and close() hung.
 * Now the thread is lost once it answers no ping for `lostMs`: its calls answer 503
 * `device_thread_lost` (with Retry-After), `/metrics` drops its series, new caches go to the
 * others, a `PUT` of its cache's id places it anew. A thread that blocks for less, or works long
 * on an event loop that answers (a CPU_REFERENCE forward on its worker pool), is not lost.
 * In process, without a GPU (each thread answers on CPU_REFERENCE); short limits.
 */
import assert from "node:assert/strict";
import { frontCaller, logged, startNoGpuThreads } from "./no_gpu_threads.ts";
import type { DeviceThreads } from "../../server/device_threads.ts";
import type { WatchdogOptions } from "../../server/thread_watchdog.ts";
import { raceTimeout } from "../../core/timeout.ts";
import { HeldSeq } from "./held_seq.ts";

/** Two threads without a GPU, with a fast watchdog; `lines` gets what the front logs. */
function twoThreads(
  watchdog: WatchdogOptions,
  lines: string[],
  memoryBudgetBytes = 2 ** 26,
): Promise<DeviceThreads> {
  return startNoGpuThreads(2, { watchdog, memoryBudgetBytes, log: (m) => lines.push(m) });
}

/** attn_kv_caches per thread, from the merged /metrics, as "0:1 1:2". */
function perThread(metrics: string): string {
  return [...metrics.matchAll(/^attn_kv_caches\{device_thread="(\d+)"\} (\d+)$/gm)]
    .map((m) => `${m[1]}:${m[2]}`).join(" ");
}

/** `p` within `ms`, or a failed assertion naming `what` (the call never answered). */
async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  const r = await raceTimeout(p, ms);
  assert.notEqual(r, "timeout", `${what}: no answer within ${ms} ms`);
  return r as T;
}

/**
 * Runs `body` on `front`, then closes it, failing (not hanging) when close() does not end (when
 * `body` failed, with its error).
 */
async function closing(front: DeviceThreads, body: () => Promise<void>): Promise<void> {
  let done = false;
  try {
    await body();
    done = true;
  } finally {
    const closed = await raceTimeout(front.close(), 5000);
    if (done) assert.notEqual(closed, "timeout", "close(): not ended within 5000 ms");
  }
}

async function assertLost(res: Response, index: number): Promise<void> {
  assert.equal(res.status, 503);
  assert.ok(res.headers.has("retry-after"), "retryable");
  const doc = await res.json();
  assert.equal(doc.code, "device_thread_lost");
  assert.match(doc.detail, new RegExp(`device thread ${index} stopped: .*answered no ping`));
}

const FAST: WatchdogOptions = { pingMs: 100, lostMs: 1000 };

Deno.test("device threads: a thread that ends without an error is lost, not waited for", async () => {
  const lines: string[] = [];
  const front = await twoThreads(FAST, lines);
  const call = frontCaller(front);
  await closing(front, async () => {
    for (const id of ["a", "b"]) {
      assert.equal((await call("PUT", `/v1/kv-caches/${id}`, HeldSeq.cacheSpec())).status, 201);
    }
    assert.equal(perThread(await (await call("GET", "/metrics")).text()), "0:1 1:1");
    front.fault(0, "exit"); // "a" lives there; so do /healthz and the rest while it runs
    const t0 = performance.now();
    const [onA, health, metrics] = await within(
      Promise.all([
        call("GET", "/v1/kv-caches/a"),
        call("GET", "/healthz"),
        call("GET", "/metrics"),
      ]),
      6000,
      "the calls routed to the thread that ended",
    );
    const waited = performance.now() - t0;
    assert.ok(waited < 4000, `answered after ${waited.toFixed(0)} ms`);
    await assertLost(onA, 0);
    // /healthz and /metrics went to thread 0 while it counted as running: now to thread 1.
    assert.ok([200, 503].includes(health.status), String(health.status));
    await health.body?.cancel();
    await metrics.body?.cancel();
    assert.equal((await call("GET", "/healthz")).status, 200);
    assert.equal(perThread(await (await call("GET", "/metrics")).text()), "1:1");
    // Later calls fail at once; new caches go to thread 1; a PUT of "a" places it anew.
    const t1 = performance.now();
    await assertLost(await call("GET", "/v1/kv-caches/a"), 0);
    assert.ok(performance.now() - t1 < 500, "a later call is refused at once");
    for (let i = 0; i < 2; i++) {
      assert.equal((await call("POST", "/v1/kv-caches", HeldSeq.cacheSpec())).status, 201);
    }
    assert.equal((await call("PUT", "/v1/kv-caches/a", HeldSeq.cacheSpec())).status, 201);
    assert.equal(perThread(await (await call("GET", "/metrics")).text()), "1:4");
    assert.equal((await call("GET", "/v1/kv-caches/b")).status, 200);
    const stopped = lines.filter((l) => /device thread 0 stopped/.test(l));
    assert.equal(stopped.length, 1, lines.join("\n"));
  });
});

Deno.test("device threads: a thread blocked past the limit is lost, a shorter block is not", async () => {
  const lines: string[] = [];
  const front = await twoThreads(FAST, lines);
  const call = frontCaller(front);
  await closing(front, async () => {
    for (const id of ["a", "b"]) {
      assert.equal((await call("PUT", `/v1/kv-caches/${id}`, HeldSeq.cacheSpec())).status, 201);
    }
    front.fault(1, { hangMs: 400 });
    assert.equal((await call("GET", "/v1/kv-caches/b")).status, 200, "a short block");
    await new Promise((r) => setTimeout(r, 1500)); // pings answered again since
    front.fault(1, { hangMs: 4000 });
    const t0 = performance.now();
    const res = await within(call("GET", "/v1/kv-caches/b"), 3500, "a call on the blocked thread");
    await assertLost(res, 1);
    assert.ok(performance.now() - t0 < 3000, "before the block ended");
    assert.equal((await call("GET", "/v1/kv-caches/a")).status, 200);
    // The blocked thread was ended: nothing comes back from it once the block is over.
    await new Promise((r) => setTimeout(r, 3000));
    assert.equal(lines.filter((l) => /device thread 1 stopped/.test(l)).length, 1);
    assert.deepEqual(lines.filter((l) => /no waiting request/.test(l)), []);
  });
});

/** One decode token attending to `seq` keys of cache `id` (CPU_REFERENCE: its worker pool). */
function longDecode(id: string, seq: number) {
  const H = 64, D = 64, rand = (n: number) => Array.from({ length: n }, () => Math.random() - 0.5);
  return {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: 1, head_size: D },
    query: { dtype: "float32", shape: [1, H, D], data: rand(H * D) },
    key: { dtype: "float32", shape: [1, 1, D], data: rand(D) },
    value: { dtype: "float32", shape: [1, 1, D], data: rand(D) },
    metadata: {
      query_start_loc: [0, 1],
      seq_lens: [seq],
      block_table: [Array.from({ length: seq / 16 }, (_, b) => b)],
      slot_mapping: [seq - 1],
    },
    kv_cache: id,
    backend: "CPU_REFERENCE",
  };
}

Deno.test("device threads: a long call on a thread that answers pings is not lost", async () => {
  const lines: string[] = [];
  const SEQ = 131_072; // 64 MiB of fp32 keys and values; about 2 s on the 2-core dev VM
  const front = await twoThreads({ pingMs: 50, lostMs: 300 }, lines, 2 ** 28);
  const call = frontCaller(front);
  await closing(front, async () => {
    const spec = {
      num_blocks: SEQ / 16,
      block_size: 16,
      num_kv_heads: 1,
      head_size: 64,
      dtype: "float32",
    };
    assert.equal((await call("PUT", "/v1/kv-caches/long", spec)).status, 201);
    const t0 = performance.now();
    const res = await call("POST", "/v1/attention/forward", longDecode("long", SEQ));
    const took = performance.now() - t0;
    assert.equal(res.status, 200, await res.clone().text());
    await res.body?.cancel();
    assert.ok(took > 300, `the call took ${took.toFixed(0)} ms, no longer than the limit`);
    assert.deepEqual(lines.filter((l) => /stopped/.test(l)), []);
  });
});

Deno.test("device threads: serving the port, a thread that ends is left out", async () => {
  const lines: string[] = [];
  const front = await twoThreads(FAST, lines);
  await closing(front, async () => {
    const server = await front.listen({ port: 0, hostname: "127.0.0.1", handler: front.handler });
    const url = `http://127.0.0.1:${server.addr.port}`;
    front.fault(1, "exit");
    await logged(lines, /device thread 1 stopped/, 10_000); // lost within 100 + 1000 ms
    // Said once: a second verdict would come within another ping and lost limit.
    await new Promise((r) => setTimeout(r, 1200));
    assert.equal(lines.filter((l) => /device thread 1 stopped/.test(l)).length, 1);
    // Fresh connections, spread by the kernel over the listeners left: every one is answered.
    const health = await within(
      Promise.all(Array.from({ length: 16 }, async () => {
        const r = await fetch(`${url}/healthz`, { headers: { connection: "close" } });
        await r.body?.cancel();
        return r.status;
      })),
      5000,
      "calls on the port",
    );
    assert.deepEqual(new Set(health), new Set([200]));
    assert.equal(server.inFlight(), 0);
    assert.deepEqual(await server.drain(1000), {
      drained: true,
      unfinished: 0,
      refused: 0,
      silent: 0,
    });
  });
});

Deno.test("device threads: with ATTN_THREAD_STUCK_MS, a thread that finishes no call for it is lost", async () => {
  const lines: string[] = [];
  const SEQ = 131_072; // about 2 s on the 2-core dev VM, then blocked 5 s more: stuck either way
  const front = await twoThreads({ pingMs: 100, lostMs: 30_000, stuckMs: 1000 }, lines, 2 ** 28);
  const call = frontCaller(front);
  await closing(front, async () => {
    const spec = { num_blocks: SEQ / 16, block_size: 16, num_kv_heads: 1, head_size: 64 };
    assert.equal(
      (await call("PUT", "/v1/kv-caches/long", { ...spec, dtype: "float32" })).status,
      201,
    );
    assert.equal((await call("PUT", "/v1/kv-caches/other", HeldSeq.cacheSpec())).status, 201);
    assert.equal(perThread(await (await call("GET", "/metrics")).text()), "0:1 1:1"); // long on 0
    const t0 = performance.now();
    const res = call("POST", "/v1/attention/forward", longDecode("long", SEQ));
    await new Promise((r) => setTimeout(r, 100)); // the call reaches its thread, which then blocks
    front.fault(0, { hangMs: 5000 });
    const lost = await within(res, 4500, "the stuck thread's call");
    assert.equal(lost.status, 503);
    const doc = await lost.json();
    assert.equal(doc.code, "device_thread_lost");
    assert.match(
      doc.detail,
      /ran calls for \d+ ms without finishing one.*ATTN_THREAD_STUCK_MS=1000/,
    );
    assert.ok(performance.now() - t0 < 4000, "lost before its block ended");
    assert.equal((await call("GET", "/v1/kv-caches/other")).status, 200, "the other thread serves");
  });
});

Deno.test("device threads: a HEAD of /metrics waits for a blocked counting thread no longer than a GET", async () => {
  // The HEAD's count on its first thread had no SCRAPE_WAIT_MS: with every thread blocked it
  // answered when the block ended (7 s here), after the GETs' 2 s.
  const lines: string[] = [];
  const front = await twoThreads({ pingMs: 100, lostMs: 20_000 }, lines);
  const call = frontCaller(front);
  await closing(front, async () => {
    assert.equal((await call("GET", "/metrics")).status, 200);
    front.fault(0, { hangMs: 7000 });
    front.fault(1, { hangMs: 7000 });
    const t0 = performance.now();
    const head = await within(call("HEAD", "/metrics"), 9000, "HEAD /metrics");
    const took = performance.now() - t0;
    assert.equal(head.status, 200);
    assert.equal(await head.text(), "");
    assert.ok(took < 5500, `answered after ${took.toFixed(0)} ms (the scrape waits 2 s a step)`);
    assert.deepEqual(lines.filter((l) => /stopped/.test(l)), [], "no thread lost");
  });
});
