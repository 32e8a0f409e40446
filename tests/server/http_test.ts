/**
 * HTTP semantics over a real port: HEAD on every GET route (the GET's status and headers, no
 * body), bounded metrics labels under invented methods, and `Retry-After` on 503 answers (but
 * one that retrying cannot help).
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { RETRY_AFTER_SECONDS } from "../../server/problem.ts";
import { FakeNoDevice, startServer } from "./helpers.ts";
import type { DeviceReport } from "../../core/types.ts";
import { rawExchange, rawRequest } from "./raw_http.ts";

Deno.test("HEAD answers every GET route with its status and headers and no body", async () => {
  const srv = await startServer();
  try {
    const c = await srv.client.createCache({
      num_blocks: 2,
      block_size: 4,
      num_kv_heads: 1,
      head_size: 8,
      dtype: "float32",
    });
    await srv.client.health(); // so /metrics has a line to show
    const paths = [
      "/healthz",
      "/v1/device",
      "/v1/backends",
      "/openapi.json",
      `/v1/kv-caches/${c.id}`,
      `/v1/kv-caches/${c.id}/data`,
      "/v1/kv-caches/nope", // a 404 problem: HEAD gets its status and headers too
    ];
    for (const path of paths) {
      const get = await rawExchange(srv.port, rawRequest("GET", path, {}));
      const head = await rawExchange(srv.port, rawRequest("HEAD", path, {}), { head: true });
      assert.ok(get && head, path);
      assert.equal(head.status, get.status, path);
      assert.equal(head.body.length, 0, `${path}: HEAD sent ${head.body.length} body bytes`);
      assert.equal(head.headers.get("content-type"), get.headers.get("content-type"), path);
      assert.equal(Number(head.headers.get("content-length")), get.body.length, path);
      for (const h of ["content-disposition", "location"]) {
        assert.equal(head.headers.get(h), get.headers.get(h), `${path} ${h}`);
      }
    }
    const m = await rawExchange(srv.port, rawRequest("HEAD", "/metrics", {}), { head: true });
    assert.equal(m?.status, 200);
    assert.match(m!.headers.get("content-type")!, /^text\/plain/);
    // HEAD is not a way around 405 on routes without GET; Allow lists HEAD where GET is.
    const r = await rawExchange(srv.port, rawRequest("HEAD", "/v1/attention/forward", {}), {
      head: true,
    });
    assert.equal(r?.status, 405);
    assert.equal(r!.headers.get("allow"), "POST");
    const patch = await fetch(`${srv.url}/v1/kv-caches/${c.id}`, { method: "PATCH" });
    assert.equal(patch.status, 405);
    assert.deepEqual(patch.headers.get("allow")!.split(", ").sort(), [
      "DELETE",
      "GET",
      "HEAD",
      "PUT",
    ]);
    await patch.body?.cancel();
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

function requestSeries(metrics: string): string[] {
  return metrics.split("\n").filter((l) => l.startsWith("attn_http_requests_total{"));
}

Deno.test('metrics: invented methods are counted as method="other"; series stay bounded', async () => {
  const srv = await startServer();
  try {
    const before = requestSeries(srv.metrics.render()).length;
    const paths = ["/healthz", "/v1/kv-caches", "/no/such/route"];
    for (let i = 0; i < 1800; i++) {
      const res = await fetch(`${srv.url}${paths[i % 3]}`, { method: `M${i.toString(36)}X` });
      await res.body?.cancel();
      assert.equal(res.status, i % 3 === 2 ? 404 : 405);
    }
    const series = requestSeries(srv.metrics.render());
    // One series per (route, status): healthz 405, kv-caches 405, unmatched 404.
    assert.equal(series.length - before, 3, `1,800 invented methods made ${series.length} series`);
    const other = series.filter((l) => l.includes('method="other"'));
    const total = other.reduce((n, l) => n + Number(l.split(" ").at(-1)), 0);
    assert.equal(total, 1800, other.join("\n"));
    for (const l of series) {
      assert.match(l, /route="(\/[^"]*|unmatched)"/);
      assert.doesNotMatch(l, /route="\/no\/such\/route"/, "paths never become labels");
    }
    // Known methods keep their names.
    const res = await fetch(`${srv.url}/healthz`, { method: "PATCH" });
    await res.body?.cancel();
    assert.match(srv.metrics.render(), /route="\/healthz",method="PATCH",status="405"/);
  } finally {
    await srv.close();
  }
});

/** A WebGPU runtime that found no device (not `--no-gpu`, whose runtime is "none"). */
class NoAdapter extends FakeNoDevice {
  override report(): DeviceReport {
    return { ...super.report(), runtime: "deno", reason: "test: no adapter" };
  }
}

Deno.test("503 answers carry Retry-After, but one that retrying cannot help", async () => {
  // Every backend, no device: forcing a GPU backend is a 503 device_unavailable. With no
  // WebGPU runtime at all (--no-gpu) that is permanent: `retryable: false`, no Retry-After.
  for (
    const [device, retry] of [
      [new NoAdapter(), String(RETRY_AFTER_SECONDS)],
      [new FakeNoDevice(), null],
    ] as const
  ) {
    const srv = await startServer({ backends: builtinBackends(), device });
    try {
      const gpu = (await srv.client.backends()).find((b) => b.available === false);
      assert.ok(gpu, "a backend that needs a device");
      const res = await fetch(`${srv.url}/v1/backends/select`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ head_size: 64, dtype: "float16", backend: gpu.name }),
      });
      assert.equal(res.status, 503);
      assert.equal(res.headers.get("retry-after"), retry);
      assert.equal(res.headers.get("content-type"), "application/problem+json");
      const doc = await res.json();
      assert.equal(doc.code, "device_unavailable");
      assert.equal(doc.retryable, retry === null ? false : undefined);
      // Logged (with its error id) only where a retry may help.
      assert.equal(srv.errors.length, retry === null ? 0 : 1);
      assert.equal(typeof doc.error_id, retry === null ? "undefined" : "string");
    } finally {
      await srv.close();
    }
  }
});
