/**
 * The seeded fuzz of fuzz_test.ts through the device-thread front (server/device_threads.ts,
 * two threads, `--no-gpu`-style services) on a real port: the front's own routing (cache paths,
 * forward bodies scanned for `kv_cache`, creates, /metrics) must keep every answer what one
 * service alone gives: no 5xx (but 503 device_unavailable, without Retry-After), every error a
 * problem document, a rejected call on the target cache changes none of its bytes, and witness
 * caches on both threads stay byte-identical. `SEED=n`, `FUZZ_COUNT=n` (default 1,500).
 */
import assert from "node:assert/strict";
import { startNoGpuThreads } from "./no_gpu_threads.ts";
import { AttentionClient } from "../../client/client.ts";
import { Rng } from "../support/rng.ts";
import { fuzzCaches, fuzzRun } from "./fuzz_check.ts";

const SEED = Number(Deno.env.get("SEED") ?? Math.floor(Math.random() * 2 ** 31));
const COUNT = Number(Deno.env.get("FUZZ_COUNT") ?? 1_500);

Deno.test(`device threads fuzz: ${COUNT} hostile requests (SEED=${SEED})`, async () => {
  console.log(`device threads fuzz: SEED=${SEED} FUZZ_COUNT=${COUNT} (set both to reproduce)`);
  const logged: string[] = [];
  const front = await startNoGpuThreads(2, {
    memoryBudgetBytes: 8 * 1024 * 1024,
    maxBodyBytes: 2 * 1024 * 1024,
    maxJsonBodyBytes: 1024 * 1024,
    log: (msg) => logged.push(msg),
  });
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, front.handler);
  const srv = { url: `http://127.0.0.1:${server.addr.port}`, port: server.addr.port };
  const client = new AttentionClient(srv.url);
  const r = new Rng(SEED);
  try {
    const { target, witnesses } = await fuzzCaches(client, r);
    await fuzzRun(srv, r, { target, witnesses, count: COUNT, seed: SEED });
    assert.deepEqual(await client.health(), { status: "ok" });
    const text = await (await fetch(`${srv.url}/metrics`)).text();
    assert.match(text, /^attn_kv_caches\{device_thread="1"\} [1-9]/m, "caches on both threads");
    assert.deepEqual(logged, [], "the front logged nothing");
  } finally {
    await server.shutdown();
    await front.close();
  }
});
