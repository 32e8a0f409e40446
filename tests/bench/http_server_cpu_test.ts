/**
 * The HTTP bench's reading of the servers' CPU time from /metrics and its per-call figures
 * (bench/http_server_cpu.ts), against a served /metrics on a real port.
 */
import assert from "node:assert/strict";
import { CpuBracket, serverCpuOf } from "../../bench/http_server_cpu.ts";
import { Metrics } from "../../server/metrics.ts";
import { mergeMetrics } from "../../server/metrics_merge.ts";
import { EMPTY_POOLS as POOLS } from "../support/empty_pools.ts";

const text = (thread: number, process: number) =>
  new Metrics({ memoryPools: () => ({ ...POOLS, cpu: { thread, process } }) }).render();

Deno.test("http bench: server CPU read from /metrics text: threads summed, the process once", () => {
  assert.deepEqual(serverCpuOf(text(1.5, 4)), { thread_s: 1.5, process_s: 4 });
  // Device threads: each thread's own time summed; every thread reports the same process time.
  assert.deepEqual(serverCpuOf(mergeMetrics([text(1.5, 4), text(0.25, 4)])), {
    thread_s: 1.75,
    process_s: 4,
  });
  assert.equal(serverCpuOf(new Metrics({ memoryPools: () => POOLS }).render()), null);
});

Deno.test("http bench: a phase's CPU a call, a scrape's own cost taken off", async () => {
  // A server whose counters advance by a script: the two reads before the phase 2 ms of thread
  // time apart (one scrape), the read after 82 ms later: (82 - 2) ms over 40 calls.
  const threads = [1.0, 1.002, 1.084], processes = [5, 5.003, 5.203];
  let n = 0;
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, () => {
    const i = n++;
    return new Response(text(threads[i], processes[i]));
  });
  try {
    const url = `http://127.0.0.1:${server.addr.port}`;
    const b = new CpuBracket([url], {});
    await b.start();
    const got = await b.end(40, 160);
    assert.ok(got);
    assert.equal(got.calls, 40);
    assert.ok(Math.abs(got.thread_ms_per_call - 2) < 1e-3, `${got.thread_ms_per_call}`);
    assert.ok(Math.abs(got.process_ms_per_call - 5) < 1e-3, `${got.process_ms_per_call}`);
    assert.ok(Math.abs(got.scrape_thread_ms - 2) < 1e-3);
    assert.ok(Math.abs(got.thread_busy! - 0.5) < 1e-3);
    n = 0;
    const none = new CpuBracket([url], {});
    await none.start();
    assert.equal(await none.end(0), null, "no calls: no figure");
  } finally {
    await server.shutdown();
  }
});
