/** The device threads' front counts its own answers under bounded route labels (server/front_metrics.ts). */
import assert from "node:assert/strict";
import { FRONT_STATIC_ROUTES, FrontMetrics, frontRoute } from "../../server/front_metrics.ts";
import { problem, problemResponse, toProblem } from "../../server/problem.ts";
import { builtinBackends } from "../../backends/index.ts";
import { createHandler } from "../../server/handler.ts";
import { AttentionService } from "../../service/service.ts";
import { FakeNoDevice } from "./helpers.ts";

Deno.test("front metrics: route labels are templates or unmatched, never the path", () => {
  assert.equal(frontRoute("/v1/kv-caches/abc"), "/v1/kv-caches/:id");
  assert.equal(frontRoute("/v1/kv-caches/abc/data"), "/v1/kv-caches/:id/data");
  assert.equal(frontRoute("/v1/kv-caches/abc/forward"), "/v1/kv-caches/:id/forward");
  assert.equal(frontRoute("/v1/kv-caches/abc/anything-else"), "unmatched");
  assert.equal(frontRoute("/v1/attention/forward"), "/v1/attention/forward");
  assert.equal(frontRoute("/healthz"), "/healthz");
  assert.equal(frontRoute("/nope/" + "x".repeat(100)), "unmatched");
});

Deno.test("front metrics: only problem answers made in this thread are counted", () => {
  const m = new FrontMetrics();
  const req = new Request("http://h/v1/kv-caches/a/forward", { method: "POST" });
  const lost = problemResponse(
    toProblem(problem(503, "device_thread_lost", "gone"), undefined, () => {}),
  );
  m.record(req, "/v1/kv-caches/a/forward", lost);
  m.record(req, "/v1/kv-caches/a/forward", new Response("relayed", { status: 503 }));
  const text = m.render();
  assert.match(
    text,
    /^attn_http_problems_total\{route="\/v1\/kv-caches\/:id\/forward",status="503",code="device_thread_lost"\} 1$/m,
  );
  assert.match(text, /^attn_http_requests_total\{[^}]*status="503"\} 1$/m, "one request counted");
  assert.doesNotMatch(text, /attn_forwards_total|attn_kv_caches/, "only the request families");
});

Deno.test("front metrics: every route the handler serves is labelled by its own template", async () => {
  const service = new AttentionService({
    backends: builtinBackends(),
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    const templates = new Set(createHandler(service).routes.map((r) => r.path));
    for (const t of templates) assert.equal(frontRoute(t.replaceAll(":id", "abc")), t, t);
    // And the front's list holds no route the handler lacks.
    for (const r of FRONT_STATIC_ROUTES) assert.ok(templates.has(r), `${r} is not a handler route`);
  } finally {
    await service.close();
  }
});
