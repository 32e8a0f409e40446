/**
 * The cache-addressed routes over a real port (CPU_REFERENCE): PUT /v1/kv-caches/{id}
 * (201, 200 for the same spec, 409 for another, concurrent PUTs), POST .../{id}/forward
 * against the float64 reference (JSON and safetensors, a body naming another cache), id
 * validation on every cache route, the instance name in answers, and the old routes beside the
 * new ones.
 */
import assert from "node:assert/strict";
import { forwardBodyToSafetensors } from "../../client/client.ts";
import { expectProblem, maxAbsDiff, serverMode, startServer } from "./helpers.ts";
import { HeldSeq } from "./held_seq.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import type { AttentionBackend } from "../../core/types.ts";

const json = (body: unknown, method = "PUT"): RequestInit => ({
  method,
  headers: { "content-type": "application/json" },
  body: JSON.stringify(body),
});

Deno.test("PUT /v1/kv-caches/{id}: 201 created, 200 same spec, 409 another; Location", async () => {
  // A second host backend (CPU_REFERENCE under another name, below it), to force another one.
  const twin = { ...CPU_REFERENCE, name: "CPU_TWIN", priority: 101 } as AttentionBackend;
  const srv = await startServer({ backends: [CPU_REFERENCE as AttentionBackend, twin] });
  try {
    const spec = HeldSeq.cacheSpec();
    const first = await fetch(`${srv.url}/v1/kv-caches/seq-1`, json(spec));
    assert.equal(first.status, 201);
    assert.equal(first.headers.get("location"), "/v1/kv-caches/seq-1");
    const info = await first.json();
    assert.equal(info.id, "seq-1");
    assert.equal(info.num_blocks, spec.num_blocks);
    // The same spec again (defaults spelled out, auto spelled as its storage dtype): the same cache.
    const again = await srv.client.putCache("seq-1", {
      ...spec,
      kv_cache_dtype: "auto",
      layout: "NHD",
      backend: "auto",
    });
    assert.equal(again.created, false);
    assert.equal(again.info.created_at, info.created_at);
    assert.equal(srv.service.caches.list().length, 1);
    // Another spec: 409, every differing field named with both values; nothing changed.
    const e = await expectProblem(
      srv.client.putCache("seq-1", { ...spec, num_blocks: 7, layout: "HND" }),
      409,
      "cache_conflict",
      ["num_blocks"],
    );
    assert.deepEqual(e.problem.issues!.map((i) => i.path[0]).sort(), ["layout", "num_blocks"]);
    assert.match(e.problem.issues![0].message, /is 7 but cache seq-1 has 6/);
    assert.equal(e.problem.cache_id, "seq-1");
    // Another known backend forced (an unknown one is a 404: cache_conflict_review_test.ts).
    await expectProblem(
      srv.client.putCache("seq-1", { ...spec, backend: "CPU_TWIN" }),
      409,
      "cache_conflict",
      ["backend"],
    );
    assert.equal((await srv.client.getCache("seq-1")).num_blocks, spec.num_blocks);
    // Deleted, the id is free again.
    await srv.client.deleteCache("seq-1");
    assert.equal((await srv.client.putCache("seq-1", { ...spec, num_blocks: 7 })).created, true);
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("PUT /v1/kv-caches/{id}: concurrent PUTs of one id make one cache", async () => {
  const srv = await startServer();
  try {
    const spec = HeldSeq.cacheSpec();
    const same = await Promise.all(
      Array.from({ length: 8 }, () => fetch(`${srv.url}/v1/kv-caches/race`, json(spec))),
    );
    const statuses = same.map((r) => r.status).sort();
    assert.deepEqual(statuses, [200, 200, 200, 200, 200, 200, 200, 201]);
    const ids = new Set((await Promise.all(same.map((r) => r.json()))).map((b) => b.created_at));
    assert.equal(ids.size, 1, "every answer is the one cache");
    assert.equal(srv.service.caches.list().length, 1);
    assert.equal(srv.service.caches.usedBytes, srv.service.getCache("race").bytes);
    // Two specs racing for a fresh id: one wins (201), the other is a 409.
    const [a, b] = await Promise.all([
      fetch(`${srv.url}/v1/kv-caches/race-2`, json(spec)),
      fetch(`${srv.url}/v1/kv-caches/race-2`, json({ ...spec, head_size: 16 })),
    ]);
    assert.deepEqual([a.status, b.status].sort(), [201, 409]);
    await Promise.all([a.body?.cancel(), b.body?.cancel()]);
    // A PUT racing a DELETE of the same id waits for it and creates afresh. Behind HTTP
    // workers the two connections may land on different threads, so either may arrive first:
    // then the outcome must be one of the two orders.
    const del = srv.client.deleteCache("race");
    const put = await srv.client.putCache("race", spec);
    await del;
    if (serverMode.httpWorkers === 0 || put.created) {
      assert.equal(put.created, true);
      assert.ok(srv.service.caches.peek("race"), "the new cache is there");
    } else {
      assert.equal(srv.service.caches.peek("race"), undefined, "the PUT came first, then DELETE");
    }
  } finally {
    await srv.close();
  }
});

Deno.test("POST /v1/kv-caches/{id}/forward: steps on the path's cache match float64", async () => {
  const srv = await startServer({ instance: "i-test" });
  try {
    await srv.client.putCache("s1", HeldSeq.cacheSpec());
    await srv.client.putCache("s2", HeldSeq.cacheSpec());
    const seq1 = new HeldSeq(), seq2 = new HeldSeq();
    for (const [n, binary] of [[5, false], [1, true], [3, false], [1, false]] as const) {
      for (const [id, seq] of [["s1", seq1], ["s2", seq2]] as const) {
        const { body, ref } = seq.step(n);
        const ans = await srv.client.forwardOn(id, body, { binary });
        assert.equal(ans.instance, "i-test");
        const err = maxAbsDiff(ans.output.values, ref);
        assert.ok(err < 2e-5, `${id} step of ${n} (binary ${binary}): max abs err ${err}`);
      }
    }
    // The body may name the path's cache; another one is a 400 naming both (JSON and binary).
    const { body } = seq1.step(1);
    await srv.client.forwardOn("s1", { ...body, kv_cache: "s1" });
    const e = await expectProblem(
      srv.client.forwardOn("s1", { ...body, kv_cache: "s2" }),
      400,
      "kv_cache_mismatch",
      ["kv_cache"],
    );
    assert.match(e.problem.detail, /"s2".*"s1"/);
    const bin = await fetch(`${srv.url}/v1/kv-caches/s1/forward`, {
      method: "POST",
      headers: { "content-type": "application/octet-stream" },
      body: forwardBodyToSafetensors({ ...body, kv_cache: "s2" }) as Uint8Array<ArrayBuffer>,
    });
    assert.equal(bin.status, 400);
    const doc = await bin.json();
    assert.equal(doc.code, "kv_cache_mismatch");
    assert.deepEqual(doc.issues[0].path, ["__metadata__", "request", "kv_cache"]);
    // An unknown cache on the path: 404 naming it, with the instance header.
    const missing = await expectProblem(srv.client.forwardOn("nope", body), 404, "cache_not_found");
    assert.equal(missing.instance, "i-test");
    // The old routes still work beside the new ones.
    const old = await srv.client.createCache(HeldSeq.cacheSpec());
    const seq3 = new HeldSeq();
    const s = seq3.step(4);
    const ans = await srv.client.forward({ ...s.body, kv_cache: old.id });
    assert.ok(maxAbsDiff(ans.output.values, s.ref) < 2e-5);
    const s2 = seq3.step(1);
    const ans2 = await srv.client.forwardOn(old.id, s2.body); // a server-chosen id fits the rule
    assert.ok(maxAbsDiff(ans2.output.values, s2.ref) < 2e-5);
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("cache ids: bounded length, safe alphabet; 400 names the field and value on every route", async () => {
  const srv = await startServer();
  try {
    const spec = HeldSeq.cacheSpec();
    const ok = ["a", "A.b_c-9", "0" + "x".repeat(127), crypto.randomUUID()];
    for (const id of ok) assert.equal((await srv.client.putCache(id, spec)).created, true, id);
    const bad = [
      "x".repeat(129), // too long
      ".hidden", // leading dot
      "..",
      "-lead",
      "a b",
      "a/b", // sent as a%2Fb: one segment, decoded, refused
      "ümlaut",
      "semi;colon",
      "%",
    ];
    const { body } = new HeldSeq().step(1);
    const json = { "content-type": "application/json" };
    // Sent as a client that does not check ids would send them (the typed client refuses them
    // itself, below): the server's check on every route.
    const send = async (id: string, method: string, tail: string, init: RequestInit = {}) => {
      const res = await fetch(`${srv.url}/v1/kv-caches/${encodeURIComponent(id)}${tail}`, {
        method,
        ...init,
      });
      return { status: res.status, problem: await res.json() };
    };
    for (const id of bad) {
      const calls: [string, () => ReturnType<typeof send>][] = [
        ["PUT", () => send(id, "PUT", "", { headers: json, body: JSON.stringify(spec) })],
        ["GET", () => send(id, "GET", "")],
        ["DELETE", () => send(id, "DELETE", "")],
        ["GET data", () => send(id, "GET", "/data")],
        ["PUT data", () =>
          send(id, "PUT", "/data", {
            headers: { "content-type": "application/octet-stream" },
            body: new Uint8Array(8),
          })],
        [
          "forward",
          () => send(id, "POST", "/forward", { headers: json, body: JSON.stringify(body) }),
        ],
      ];
      for (const [what, call] of calls) {
        const e = await call();
        // ".." is a dot-segment: fetch resolves it to /v1/, no cache route (404 or 405); sent as
        // it is, the server refuses it as an id (contract_edges_test.ts).
        if (id === "..") {
          assert.ok([404, 405].includes(e.status), `${what} ${id}: ${e.status}`);
          continue;
        }
        assert.equal(e.status, 400, `${what} ${JSON.stringify(id)}: ${JSON.stringify(e.problem)}`);
        assert.equal(e.problem.code, "invalid_cache_id");
        assert.deepEqual(e.problem.issues?.[0].path, ["id"]);
        const shown = JSON.stringify(id).slice(0, 40);
        assert.ok(
          e.problem.detail.includes(shown.slice(0, 20)),
          `${e.problem.detail} names ${shown}`,
        );
      }
      // The typed client refuses the id itself, with the server's problem, sending nothing.
      for (const call of [() => srv.client.getCache(id), () => srv.client.forwardOn(id, body)]) {
        const e = await expectProblem(call(), 400, "invalid_cache_id", ["id"]);
        assert.match(e.problem.detail, /refused by the client/);
      }
    }
    // A kv_cache that breaks the rule in a body on the old route: 400 at kv_cache.
    await expectProblem(
      srv.client.forward({ ...body, kv_cache: "a b" }),
      400,
      "invalid_request",
      ["kv_cache"],
    );
    assert.equal(srv.service.caches.list().length, ok.length, "no cache made by a bad id");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("--instance-name: X-Attention-Instance on every answer, problems too; /healthz names it", async () => {
  const named = await startServer({ instance: "gpu-3" });
  const plain = await startServer();
  try {
    assert.deepEqual(await named.client.health(), { status: "ok", instance: "gpu-3" });
    assert.deepEqual(await plain.client.health(), { status: "ok" });
    const cases: [string, RequestInit][] = [
      ["/v1/backends", {}],
      ["/nowhere", {}],
      ["/v1/kv-caches/x", { method: "PATCH" }],
      ["/v1/kv-caches/x", json(HeldSeq.cacheSpec())],
    ];
    for (const [path, init] of cases) {
      const r = await fetch(`${named.url}${path}`, init);
      assert.equal(r.headers.get("x-attention-instance"), "gpu-3", `${path} ${r.status}`);
      await r.body?.cancel();
      const p = await fetch(`${plain.url}${path}`, { method: init.method ?? "GET" });
      assert.equal(p.headers.get("x-attention-instance"), null);
      await p.body?.cancel();
    }
  } finally {
    await named.close();
    await plain.close();
  }
});
