/**
 * Seeded fuzz over a real port: thousands of hostile requests (see fuzz_gen.ts) against a
 * `--no-gpu`-style service (every backend, NoDeviceProvider). Asserts: no 5xx (except 503
 * device_unavailable, `retryable: false` without Retry-After, the right answer to forcing a GPU
 * backend here), every error a problem document (application/problem+json; type, title, status,
 * detail, code; no stack trace), a rejected call on the target cache changes none of its bytes, three witness
 * caches no request names are byte-identical at the end (GET /v1/kv-caches/{id}/data), nothing
 * logged as unexpected, bounded metrics series, and the server still answers.
 *
 * `SEED=n` reproduces a run (the seed is printed); `FUZZ_COUNT=n` sets the number of requests
 * (default 10,000).
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { ServiceError } from "../../core/errors.ts";
import { NoDeviceProvider } from "../../gpu/device.ts";
import { Rng } from "../support/rng.ts";
import { fuzzCaches, fuzzRun } from "./fuzz_check.ts";
import { startServer } from "./helpers.ts";

const SEED = Number(Deno.env.get("SEED") ?? Math.floor(Math.random() * 2 ** 31));
const COUNT = Number(Deno.env.get("FUZZ_COUNT") ?? 10_000);

Deno.test(`fuzz: ${COUNT} hostile requests (SEED=${SEED}): no 5xx, problems, caches intact`, async () => {
  console.log(`fuzz: SEED=${SEED} FUZZ_COUNT=${COUNT} (set both to reproduce)`);
  const srv = await startServer({
    backends: builtinBackends(),
    device: new NoDeviceProvider(),
    memoryBudgetBytes: 4 * 1024 * 1024,
    maxBodyBytes: 2 * 1024 * 1024,
    maxJsonBodyBytes: 1024 * 1024,
  });
  const r = new Rng(SEED);
  const t0 = performance.now();
  try {
    const { target, witnesses } = await fuzzCaches(srv.client, r);
    const { statuses, codes } = await fuzzRun(srv, r, {
      target,
      witnesses,
      count: COUNT,
      seed: SEED,
    });
    assert.deepEqual(await srv.client.health(), { status: "ok" });
    const unexpected = srv.errors.filter((e) =>
      !(e instanceof ServiceError && e.code === "device_unavailable")
    );
    assert.deepEqual(unexpected.map(String), [], "nothing logged as unexpected");
    const series = srv.metrics.render().split("\n").filter((l) =>
      l.startsWith("attn_http_requests_total")
    );
    assert.ok(series.length < 150, `${series.length} request series`);
    const s = [...statuses].sort((a, b) => a[0] - b[0]).map(([k, n]) => `${k}:${n}`).join(" ");
    const c = [...codes].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k}:${n}`).join(" ");
    console.log(`fuzz: ${COUNT} requests in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    console.log(`fuzz: statuses ${s}`);
    console.log(`fuzz: problem codes ${c}`);
  } finally {
    await srv.close();
  }
});
