/**
 * `attn_http_problems_total`: problem answers counted by route, status and code over a real
 * port, so a 503 `queue_timeout` and a 404 `cache_not_found` are told apart from the other
 * answers of their status; a 200 adds no problem series.
 */
import assert from "node:assert/strict";
import { QUEUE_TIMEOUT_HEADER } from "../../wire/names.ts";
import { startServer } from "./helpers.ts";

Deno.test("metrics: problem answers are counted by route, status and code", async () => {
  const srv = await startServer();
  try {
    const post = (path: string, headers: Record<string, string> = {}) =>
      fetch(`${srv.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: "{}",
      }).then((r) => r.body?.cancel());
    await post("/v1/kv-caches/nope/forward");
    await post("/v1/kv-caches/nope/forward");
    await post("/v1/attention/forward", { [QUEUE_TIMEOUT_HEADER]: "-1" });
    await post("/v1/attention/forward");
    assert.deepEqual(await srv.client.health(), { status: "ok" });
    const text = await (await fetch(`${srv.url}/metrics`)).text();
    const lines = text.split("\n").filter((l) => l.startsWith("attn_http_problems_total{"));
    assert.deepEqual(
      lines.sort(),
      [
        'attn_http_problems_total{route="/v1/attention/forward",status="400",code="invalid_header"} 1',
        'attn_http_problems_total{route="/v1/attention/forward",status="400",code="invalid_request"} 1',
        'attn_http_problems_total{route="/v1/kv-caches/:id/forward",status="404",code="cache_not_found"} 2',
      ].sort(),
    );
    assert.match(text, /# TYPE attn_http_problems_total counter/);
  } finally {
    await srv.close();
  }
});
