/**
 * The queue timeout through `--device-threads` (two threads without a GPU, CPU_REFERENCE): the
 * front passes `X-Attention-Queue-Timeout-Ms` on to the cache's thread, whose handler refuses a
 * bad value (400 `invalid_header`) and answers a call queued past it behind a long prefill on the
 * same cache with a 503 `queue_timeout` that wrote nothing.
 */
import assert from "node:assert/strict";
import { AttentionClient, type ForwardBody } from "../../client/client.ts";
import { QUEUE_TIMEOUT_HEADER } from "../../wire/names.ts";
import { expectProblem, prefillBody } from "./helpers.ts";
import { startNoGpuThreads } from "./no_gpu_threads.ts";

const H = 4, HKV = 2, D = 64, BS = 16, T = 1024;

const prefill = (kv_cache: string, t: number, first: number): ForwardBody => ({
  ...prefillBody({ h: H, hkv: HKV, d: D, bs: BS, t, first }),
  kv_cache,
});

Deno.test("queue timeout through device threads: a bad header is a 400, a late call a 503", async () => {
  const front = await startNoGpuThreads(2);
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, front.handler);
  const client = new AttentionClient(`http://127.0.0.1:${server.addr.port}`);
  try {
    const spec = { num_blocks: T / BS + 1, block_size: BS, num_kv_heads: HKV, head_size: D };
    const info = await client.createCache({ ...spec, dtype: "float32" } as never);
    const bad = await fetch(
      `http://127.0.0.1:${server.addr.port}/v1/kv-caches/${info.id}/forward`,
      {
        method: "POST",
        headers: { "content-type": "application/json", [QUEUE_TIMEOUT_HEADER]: "soon" },
        body: JSON.stringify(prefill(info.id, 1, T)),
      },
    );
    assert.equal(bad.status, 400);
    const doc = await bad.json();
    assert.equal(doc.code, "invalid_header");
    assert.equal(doc.value, "soon");
    // A long prefill (1,024 tokens: 1.6 s on the 2-core dev VM, once), then a one-token step on
    // the same cache that may wait 100 ms to start: more than its trip from the front to the
    // thread, which counts (1 ms was spent by the trip alone under load), less than the prefill.
    // The prefill goes as safetensors, decoded inline as the step is: a JSON body this size is
    // decoded in a worker, and the step, sent later, could reach the cache first and run.
    let longDone = false;
    const long = client.forwardOn(info.id, prefill(info.id, T, 0), { binary: true })
      .finally(() => longDone = true);
    // Its body read by the front before the step's: 50 ms was not always enough on a loaded
    // 2-core VM (a CI run beside another suite: the step reached the cache first and ran);
    // 250 ms still leaves the prefill over a second to hold the cache.
    await new Promise((r) => setTimeout(r, 250));
    const late = client.forwardOn(info.id, prefill(info.id, 1, T), { queueTimeoutMs: 100 });
    const e = await expectProblem(late, 503, "queue_timeout");
    assert.equal(e.problem.queue_timeout_ms, 100);
    assert.equal(longDone, false, "answered at its timeout, while the prefill held the cache");
    const ans = await long;
    assert.deepEqual(ans.output.shape, [T, H, D]);
    // Slot T was written by no call: the late step did not run.
    const data = await client.cacheData(info.id);
    const k = new Float32Array(data.key_cache.data.slice().buffer);
    const row = k.subarray(T * HKV * D, (T + 1) * HKV * D);
    assert.ok(row.every((x) => x === 0), "the late call's slot is untouched");
  } finally {
    await server.shutdown();
    await front.close();
  }
});
