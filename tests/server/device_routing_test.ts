/**
 * What the device-thread front decides from bytes alone: the cache a forward body names
 * (server/forward_cache_id.ts: JSON bodies by a scan of their top level, safetensors bodies by
 * their header's `__metadata__.request`), and the merged /metrics (server/metrics_merge.ts).
 */
import assert from "node:assert/strict";
import { forwardCacheId, topLevelString } from "../../server/forward_cache_id.ts";
import { mergeMetrics } from "../../server/metrics_merge.ts";
import { serializeSafetensors } from "../../core/safetensors.ts";

const bytes = (s: string) => new TextEncoder().encode(s);
const json = (s: string) => forwardCacheId(bytes(s), false);

Deno.test("forward cache id: JSON bodies, as JSON.parse would read kv_cache", () => {
  const cases: string[] = [
    `{"kv_cache":"a"}`,
    ` { "layer": {"kv_cache": "nested"}, "kv_cache" : "b" , "x": [1, {"kv_cache":"n"}] }`,
    `{"q":"a string with \\"kv_cache\\":\\"fake\\" and { [ brackets","kv_cache":"c"}`,
    `{"kv_cache":"first","kv_cache":"last"}`,
    `{"kv\\u005fcache":"escaped-key"}`,
    `{"kv_cache":"esc\\"aped\\u0041"}`,
    `{"query":{"data":[1,2,3]},"metadata":{"seq_lens":[1]}}`,
    `{"kv_cache":null}`,
    `{"kv_cache":7}`,
    `{"other":"kv_cache"}`,
  ];
  for (const c of cases) {
    const want = JSON.parse(c).kv_cache;
    assert.equal(json(c), typeof want === "string" ? want : undefined, c);
  }
});

Deno.test("forward cache id: bodies that are not what they say name nothing", () => {
  for (
    const c of [``, `[{"kv_cache":"a"}]`, `"kv_cache"`, `{"kv_cache":"unterminated`, `{"kv_cache"`]
  ) {
    assert.equal(json(c), undefined, c);
  }
  assert.equal(topLevelString(bytes(`{"a":{"b":"c"}}`), "b"), undefined);
  assert.equal(forwardCacheId(new Uint8Array([1, 2, 3]), true), undefined);
  const huge = new Uint8Array(16);
  new DataView(huge.buffer).setBigUint64(0, 2n ** 40n, true);
  assert.equal(forwardCacheId(huge, true), undefined);
});

Deno.test("forward cache id: safetensors bodies, from __metadata__.request", () => {
  const body = (request: object) =>
    serializeSafetensors(
      { query: { dtype: "F32", shape: [1], data: new Uint8Array(4) } },
      { request: JSON.stringify(request) },
    );
  assert.equal(forwardCacheId(body({ dtype: "float32", kv_cache: "st-1" }), true), "st-1");
  assert.equal(forwardCacheId(body({ dtype: "float32" }), true), undefined);
  // The same header again (memoized) and another one.
  assert.equal(forwardCacheId(body({ dtype: "float32", kv_cache: "st-1" }), true), "st-1");
  assert.equal(forwardCacheId(body({ kv_cache: "st-2" }), true), "st-2");
});

Deno.test("merged metrics: each family once, every thread's samples labelled", () => {
  const t0 = [
    "# HELP x_total X.",
    "# TYPE x_total counter",
    'x_total{route="/a"} 3',
    "# HELP g Gauge.",
    "# TYPE g gauge",
    "g 5",
    "",
  ].join("\n");
  const t1 = [
    "# HELP x_total X.",
    "# TYPE x_total counter",
    'x_total{route="/a"} 4',
    'x_total{route="/b"} 1',
    "# HELP g Gauge.",
    "# TYPE g gauge",
    "g 7",
    "# HELP h Only here.",
    "# TYPE h gauge",
    "h{} 1",
    "",
  ].join("\n");
  assert.equal(
    mergeMetrics([t0, t1]),
    [
      "# HELP x_total X.",
      "# TYPE x_total counter",
      'x_total{device_thread="0",route="/a"} 3',
      'x_total{device_thread="1",route="/a"} 4',
      'x_total{device_thread="1",route="/b"} 1',
      "# HELP g Gauge.",
      "# TYPE g gauge",
      'g{device_thread="0"} 5',
      'g{device_thread="1"} 7',
      "# HELP h Only here.",
      "# TYPE h gauge",
      'h{device_thread="1"} 1',
      "",
    ].join("\n"),
  );
});
