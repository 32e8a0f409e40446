/**
 * What the device-thread front decides on its own: the cache a forward body names
 * (server/forward_cache_id.ts: JSON bodies by a scan of their top level, safetensors bodies by
 * their header's `__metadata__.request`, big ones on the scan worker), where caches go
 * (server/cache_placement.ts, server/create_elsewhere.ts), the merged /metrics (server/metrics_merge.ts), and a client gone
 * before its call was sent (server/request_sender.ts).
 */
import assert from "node:assert/strict";
import {
  findForwardCacheId,
  forwardCacheId,
  scansHere,
  scanWorker,
  topLevelString,
} from "../../server/forward_cache_id.ts";
import { CachePlacement } from "../../server/cache_placement.ts";
import { PerKeyQueue, putOnSomeThread } from "../../server/create_elsewhere.ts";
import { RequestSender } from "../../server/request_sender.ts";
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
    `\uFEFF{"kv_cache":"after a byte order mark"}`,
    `{"\u006b\u0076\u005f\u0063\u0061\u0063\u0068\u0065":"every character escaped"}`,
  ];
  for (const c of cases) {
    const want = JSON.parse(c.replace(/^\uFEFF/, "")).kv_cache;
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
  assert.equal(topLevelString(bytes(`{"backend":"x","b":"y"}`), "backend"), "x");
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

Deno.test("forward cache id: big bodies are scanned on the worker, their bytes handed back", async () => {
  const worker = scanWorker();
  try {
    const big = `{"query":{"data":[${"0.5,".repeat(400_000)}1]},"kv_cache":"big-json"}`;
    const b = bytes(big);
    assert.equal(scansHere(b, false), false);
    const found = await findForwardCacheId(b, false, worker);
    assert.equal(found.id, "big-json");
    assert.equal(new TextDecoder().decode(found.bytes), big, "the same bytes come back");
    const small = bytes(`{"kv_cache":"here"}`);
    assert.deepEqual(await findForwardCacheId(small, false, worker), { id: "here", bytes: small });
    const st = serializeSafetensors(
      { query: { dtype: "F32", shape: [1], data: new Uint8Array(4) } },
      { request: JSON.stringify({ kv_cache: "big-header" }), pad: "x".repeat(100_000) },
    );
    assert.equal(scansHere(st, true), false);
    assert.equal((await findForwardCacheId(st, true, worker)).id, "big-header");
  } finally {
    worker.close();
  }
});

/** A holder for placement tests. */
const holder = () => ({ caches: 0, lost: null as string | null });

Deno.test("cache placement: creates in flight count, so creates sent together spread", () => {
  const hs = [holder(), holder()];
  const p = new CachePlacement(hs);
  const r = [p.reserve(), p.reserve(), p.reserve(), p.reserve()];
  assert.deepEqual(r.map((x) => hs.indexOf(x.holder)), [0, 1, 0, 1]);
  r[0].done("a");
  r[1].done(null); // refused: no count left behind
  assert.deepEqual(hs.map((h) => h.caches), [2, 1], "r[2] and r[3] still in flight");
  assert.equal(p.holderOf("a"), hs[0]);
  p.deleted("a");
  assert.equal(p.holderOf("a"), undefined);
  assert.deepEqual(hs.map((h) => h.caches), [1, 1]);
});

Deno.test("cache placement: a PUT refused beside one that succeeded keeps the cache placed", () => {
  const hs = [holder(), holder()];
  const p = new CachePlacement(hs);
  const bad = p.put("x"), good = p.put("x");
  assert.equal(bad.holder, good.holder);
  bad.done(false); // the refused one answers first
  good.done(true);
  assert.equal(p.holderOf("x"), hs[0]);
  const bad2 = p.put("y"), good2 = p.put("y");
  good2.done(true);
  bad2.done(false);
  assert.equal(p.holderOf("y"), hs[1]);
  const lone = p.put("z");
  lone.done(false); // refused alone: gone, uncounted
  assert.equal(p.holderOf("z"), undefined);
  assert.deepEqual(hs.map((h) => h.caches), [1, 1]);
});

Deno.test("cache placement: PUTs of one new id sent together find the thread with room", async () => {
  // Thread 0 has no room (every create there is refused for memory), thread 1 has. Both PUTs
  // went to thread 0 (the second followed the first's place) and the first's retry went back
  // there while the second was in flight: both 422 "none has room", thread 1 never tried.
  const hs = [holder(), holder()];
  hs[1].caches = 5; // thread 0 looks emptier, so it is chosen first
  const places = new CachePlacement(hs);
  const queue = new PerKeyQueue();
  const sent: number[] = [];
  const gate = Promise.withResolvers<void>();
  const send = async (h: (typeof hs)[number]) => {
    sent.push(hs.indexOf(h));
    await gate.promise;
    if (h === hs[0]) {
      const doc = { status: 422, code: "memory_budget_exceeded", detail: "no room" };
      return new Response(JSON.stringify(doc), { status: 422 });
    }
    return new Response("{}", { status: sent.filter((x) => x === 1).length === 1 ? 201 : 200 });
  };
  const body = { bytes: new Uint8Array(1), end: "complete" as const };
  const both = Promise.all(
    [0, 1].map(() => putOnSomeThread(places, queue, "x", body, send)),
  );
  setTimeout(() => gate.resolve(), 10);
  const statuses = (await both).map((r) => r.status);
  assert.deepEqual(statuses, [201, 200], `sent to threads ${sent}`);
  assert.deepEqual(sent, [0, 1, 1], "the first tries 0 then 1; the second follows it to 1");
  assert.equal(places.holderOf("x"), hs[1]);
  assert.equal(queue.size, 0, "the queue lets go of the id");
});

Deno.test("cache placement: a DELETE answered while a PUT of the id runs keeps the place", () => {
  const hs = [holder(), holder()];
  const p = new CachePlacement(hs);
  p.put("x").done(true);
  p.put("w").done(true); // x on hs[0], w on hs[1]
  // DELETE and PUT sent together: the thread deletes, then creates again; the 204 comes first.
  const again = p.put("x");
  p.deleted("x");
  assert.equal(p.holderOf("x"), hs[0], "still routed while the PUT runs");
  again.done(true);
  assert.equal(p.holderOf("x"), hs[0], "the new cache is reachable");
  assert.deepEqual(hs.map((h) => h.caches), [1, 1]);
  // The other order on the thread: the PUT found the cache (200), then the DELETE removed it.
  const found = p.put("x");
  found.done(true);
  p.deleted("x");
  assert.equal(p.holderOf("x"), undefined);
  assert.deepEqual(hs.map((h) => h.caches), [0, 1]);
  // A PUT beside a DELETE that is refused after it: nothing left behind.
  p.put("y").done(true);
  const refused = p.put("y");
  p.deleted("y");
  refused.done(false);
  assert.equal(p.holderOf("y"), undefined);
  assert.deepEqual(hs.map((h) => h.caches), [0, 1]);
});

Deno.test("cache placement: a lost holder's cache is placed anew by the next PUT", () => {
  const hs = [holder(), holder()];
  const p = new CachePlacement(hs);
  p.put("x").done(true);
  assert.equal(p.holderOf("x"), hs[0]);
  hs[0].lost = "crashed";
  assert.deepEqual(p.live(), [hs[1]]);
  const again = p.put("x");
  assert.equal(again.holder, hs[1]);
  again.done(true);
  assert.equal(p.holderOf("x"), hs[1]);
  hs[1].lost = "crashed too";
  assert.deepEqual(p.live(), [hs[0]], "none running: the first answers for its loss");
});

Deno.test("request sender: a client gone before its call was sent is passed on", async () => {
  const posted: { type: string; id?: number }[] = [];
  const sender = new RequestSender((m) => posted.push(m), 1 << 20, () => true);
  const abort = new AbortController();
  const req = new Request("http://127.0.0.1/v1/attention/forward", {
    method: "POST",
    body: "{}",
    signal: abort.signal,
  });
  const body = await sender.readBody(req); // a front reads the body first, to route the call
  abort.abort(); // the client goes away meanwhile
  const answer = sender.send(req, body);
  assert.deepEqual(posted.map((m) => m.type), ["head", "abort", "body"]);
  sender.failAll(new Error("owner gone"));
  assert.equal((await answer).status, 500);
});
