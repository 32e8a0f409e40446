/**
 * Every bad input gets its RFC 9457 problem with the right status and code, the server stays
 * up, and a rejected call changes no cache (cache bytes compared before/after).
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { forwardBodyToSafetensors } from "../../client/client.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { fakeBackend } from "../service/helpers.ts";
import { cacheSnapshot, expectProblem, rand, startServer, type TestServer } from "./helpers.ts";

const H = 4, HKV = 2, D = 8, BS = 4, NB = 4;
/** The cache every test here makes. */
const SPEC = {
  num_blocks: NB,
  block_size: BS,
  num_kv_heads: HKV,
  head_size: D,
  dtype: "float32" as const,
};

/** A valid decode body for a held cache: 2 requests, 3 + 2 tokens. */
function validBody(kv_cache?: string): ForwardBody {
  const T = 5;
  return {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: { dtype: "float32", shape: [T, H, D], data: rand(T * H * D) },
    key: { dtype: "float32", shape: [T, HKV, D], data: rand(T * HKV * D) },
    value: { dtype: "float32", shape: [T, HKV, D], data: rand(T * HKV * D) },
    metadata: {
      query_start_loc: [0, 3, 5],
      seq_lens: [3, 2],
      block_table: [[0], [3]],
      slot_mapping: [0, 1, 2, 12, 13],
    },
    kv_cache,
  };
}

async function raw(srv: TestServer, path: string, init: RequestInit) {
  const res = await fetch(`${srv.url}${path}`, init);
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : null };
}

function assertProblem(
  r: { status: number; headers: Headers; body: Record<string, unknown> },
  status: number,
  code: string,
) {
  assert.equal(r.status, status, JSON.stringify(r.body));
  assert.equal(r.headers.get("content-type"), "application/problem+json");
  assert.equal(r.body.status, status);
  assert.equal(r.body.code, code);
  for (const k of ["type", "title", "detail"]) assert.equal(typeof r.body[k], "string", k);
}

Deno.test("errors: every bad input is a problem; nothing changes; server stays up", async (t) => {
  const srv = await startServer({ memoryBudgetBytes: 100_000 });
  try {
    const cache = await srv.client.createCache(SPEC);
    await srv.client.forward(validBody(cache.id)); // fill some slots
    const before = await cacheSnapshot(srv, cache.id);
    const fwd = (patch: (b: ForwardBody) => void) => {
      const b = validBody(cache.id);
      patch(b);
      return srv.client.forward(b);
    };
    const json = (path: string, body: string, ct = "application/json") =>
      raw(srv, path, { method: "POST", headers: { "content-type": ct }, body });

    await t.step("malformed JSON → 400 malformed_json", async () => {
      assertProblem(
        await json("/v1/attention/forward", '{"dtype": "float32",'),
        400,
        "malformed_json",
      );
      assertProblem(await json("/v1/kv-caches", ""), 400, "malformed_json");
    });
    await t.step("wrong content type → 415", async () => {
      const r = await json(
        "/v1/attention/forward",
        JSON.stringify(validBody(cache.id)),
        "text/plain",
      );
      assertProblem(r, 415, "unsupported_media_type");
      assertProblem(
        await json("/v1/kv-caches", "{}", "application/octet-stream"),
        415,
        "unsupported_media_type",
      );
    });
    await t.step("unknown route → 404; wrong method → 405 with Allow", async () => {
      assertProblem(await raw(srv, "/v2/nothing", {}), 404, "not_found");
      const r = await raw(srv, "/v1/attention/forward", { method: "GET" });
      assertProblem(r, 405, "method_not_allowed");
      assert.equal(r.headers.get("allow"), "POST");
      const r2 = await raw(srv, `/v1/kv-caches/${cache.id}`, { method: "POST" });
      assertProblem(r2, 405, "method_not_allowed");
      assert.deepEqual(r2.headers.get("allow")!.split(", ").sort(), [
        "DELETE",
        "GET",
        "HEAD",
        "PUT",
      ]);
    });
    await t.step("unknown cache → 404", async () => {
      await expectProblem(srv.client.getCache("nope"), 404, "cache_not_found");
      await expectProblem(srv.client.cacheData("nope"), 404, "cache_not_found");
      await expectProblem(srv.client.deleteCache("nope"), 404, "cache_not_found");
      await expectProblem(srv.client.forward(validBody("nope")), 404, "cache_not_found");
    });
    await t.step("unknown backend → 404", async () => {
      await expectProblem(
        srv.client.select({ head_size: 64, dtype: "float16", backend: "NOPE" }),
        404,
        "unknown_backend",
      );
      await expectProblem(fwd((b) => b.backend = "NOPE"), 404, "unknown_backend");
      await expectProblem(
        srv.client.createCache({
          num_blocks: 1,
          block_size: 4,
          num_kv_heads: 1,
          head_size: 8,
          dtype: "float32",
          backend: "NOPE",
        }),
        404,
        "unknown_backend",
      );
    });
    await t.step("no valid backend → 422 with reasons", async () => {
      const e = await expectProblem(
        srv.client.select({ head_size: 64, dtype: "float16", use_mla: true }),
        422,
        "no_valid_backend",
      );
      assert.ok(
        Array.isArray(e.problem.reasons?.CPU_REFERENCE) &&
          e.problem.reasons.CPU_REFERENCE.length > 0,
      );
    });
    await t.step("schema violations name the field", async () => {
      const e = await expectProblem(
        fwd((b) => (b.layer as Record<string, unknown>).num_heads = "4"),
        400,
        "invalid_request",
        [
          "layer",
          "num_heads",
        ],
      );
      assert.match(e.problem.issues![0].message, /"4"/, "current value in the message");
      await expectProblem(
        fwd((b) => delete (b as Partial<ForwardBody>).dtype),
        400,
        "invalid_request",
        ["dtype"],
      );
      await expectProblem(
        fwd((b) => (b as unknown as Record<string, unknown>).colour = 1),
        400,
        "invalid_request",
        ["colour"],
      );
      await expectProblem(fwd((b) => b.query.dtype = "float64"), 400, "invalid_request", [
        "query",
        "dtype",
      ]);
      await expectProblem(
        srv.client.select({ head_size: -1, dtype: "float16" }),
        400,
        "invalid_request",
        ["head_size"],
      );
      await expectProblem(
        srv.client.createCache({
          num_blocks: 0,
          block_size: 4,
          num_kv_heads: 1,
          head_size: 8,
          dtype: "float32",
        }),
        400,
        "invalid_request",
        ["num_blocks"],
      );
    });
    await t.step("tensor encodings: element count, bad base64 → 400", async () => {
      await expectProblem(fwd((b) => b.query.data!.pop()), 400, "bad_tensor", ["query", "data"]);
      await expectProblem(
        fwd((b) => b.key = { dtype: "float32", shape: [5, HKV, D], base64: "!!notbase64!!" }),
        400,
        "bad_base64",
        ["key", "base64"],
      );
      // Whitespace inside: fromBase64 skipped it, so the call was served (session 38's audit).
      const spaced = new Uint8Array(4 * 5 * HKV * D).toBase64().replace(/(.{4})/g, "$1 ").trim();
      await expectProblem(
        fwd((b) => b.key = { dtype: "float32", shape: [5, HKV, D], base64: spaced }),
        400,
        "bad_base64",
        ["key", "base64"],
      );
      await expectProblem(
        fwd((b) =>
          b.metadata.slot_mapping = {
            dtype: "int64",
            shape: [5],
            base64: new Uint8Array(new BigInt64Array([0n, 1n, 2n, 12n, 2n ** 40n]).buffer)
              .toBase64(),
          }
        ),
        422,
        "invalid_batch",
        ["metadata", "slot_mapping", 4],
      );
    });
    await t.step("shapes that disagree with the layer → 422", async () => {
      await expectProblem(fwd((b) => b.query.shape = [5, 2, 16]), 422, "invalid_batch", [
        "query",
        "shape",
      ]);
      await expectProblem(fwd((b) => b.layer.num_kv_heads = 1), 422, "invalid_batch", [
        "layer",
        "num_kv_heads",
      ]);
      await expectProblem(fwd((b) => b.layer.num_kv_heads = 3), 422, "invalid_batch", [
        "layer",
        "num_heads",
      ]);
    });
    await t.step("batch metadata → 422 naming the entry", async () => {
      await expectProblem(
        fwd((b) => b.metadata.query_start_loc = [0, 4, 3, 5]),
        422,
        "invalid_batch",
        [
          "metadata",
          "query_start_loc",
          2,
        ],
      );
      await expectProblem(fwd((b) => b.metadata.seq_lens = [2, 2]), 422, "invalid_batch", [
        "metadata",
        "seq_lens",
        0,
      ]);
      await expectProblem(fwd((b) => b.metadata.block_table = [[0], [NB]]), 422, "invalid_batch", [
        "metadata",
        "block_table",
        1,
        0,
      ]);
      await expectProblem(
        fwd((b) => b.metadata.slot_mapping = [0, 1, 2, 12, NB * BS]),
        422,
        "invalid_batch",
        [
          "metadata",
          "slot_mapping",
          4,
        ],
      );
      const dup = await expectProblem(
        fwd((b) => b.metadata.slot_mapping = [0, 1, 2, 12, 1]),
        422,
        "invalid_batch",
        [
          "metadata",
          "slot_mapping",
          4,
        ],
      );
      assert.match(dup.problem.issues![0].message, /slot 1 duplicates slot_mapping\[1\]/);
    });
    await t.step("every problem listed at once", async () => {
      const e = await expectProblem(
        fwd((b) => {
          b.query.shape = [5, 2, 16];
          b.metadata.seq_lens = [1, 2];
          b.metadata.slot_mapping = [0, 0, -1, -1, 99];
          b.layer.sliding_window = 0;
        }),
        422,
        "invalid_batch",
      );
      const paths = e.problem.issues!.map((i) => i.path.join("."));
      for (
        const p of [
          "query.shape",
          "metadata.seq_lens.0",
          "metadata.slot_mapping.1",
          "metadata.slot_mapping.4",
          "layer.sliding_window",
        ]
      ) {
        assert.ok(paths.includes(p), `${p} in ${paths}`);
      }
    });
    await t.step("bad safetensors bodies → 400", async () => {
      const garbage = new Uint8Array(16);
      new DataView(garbage.buffer).setBigUint64(0, 1000n, true);
      const r = await raw(srv, "/v1/attention/forward", {
        method: "POST",
        headers: { "content-type": "application/octet-stream" },
        body: garbage,
      });
      assertProblem(r, 400, "bad_safetensors");
      const noReq = forwardBodyToSafetensors(validBody(cache.id));
      const ok = await raw(srv, "/v1/attention/forward", {
        method: "POST",
        headers: { "content-type": "application/octet-stream" },
        body: noReq.slice(0, noReq.length - 4),
      });
      assertProblem(ok, 400, "bad_safetensors");
    });
    await t.step("budget exceeded → 422, nothing allocated", async () => {
      const used = srv.service.caches.usedBytes;
      const e = await expectProblem(
        srv.client.createCache({
          num_blocks: 1000,
          block_size: 16,
          num_kv_heads: 8,
          head_size: 128,
          dtype: "float16",
        }),
        422,
        "memory_budget_exceeded",
      );
      assert.equal(e.problem.requested_bytes, 2 * 1000 * 16 * 8 * 128 * 2);
      assert.equal(e.problem.remaining_bytes, 100_000 - used);
      assert.equal(srv.service.caches.usedBytes, used);
    });
    await t.step("cache misuse → 422", async () => {
      await expectProblem(fwd((b) => delete b.kv_cache), 422, "invalid_batch", ["kv_cache"]);
      await expectProblem(fwd((b) => b.dtype = "float16"), 422, "invalid_batch", ["dtype"]);
      await expectProblem(
        fwd((b) => b.layer = { ...b.layer, attn_type: "encoder_decoder", causal: true }),
        422,
        "invalid_batch",
        ["layer", "causal"],
      );
    });
    assert.equal(await cacheSnapshot(srv, cache.id), before, "no rejected call changed the cache");
    assert.deepEqual(await srv.client.health(), { status: "ok" });
    assert.deepEqual(srv.errors, [], "no unexpected (500) errors");
  } finally {
    await srv.close();
  }
});

Deno.test("errors: a call over a per-call limit and invalid is one 422 listing every problem", async () => {
  const srv = await startServer({ limits: { max_tokens: 4, max_attended_keys: 5 } });
  try {
    const cache = await srv.client.createCache(SPEC);
    const before = await cacheSnapshot(srv, cache.id);
    // 5 tokens (over max_tokens 4), 3*4/2 + 2*3/2 = 9 attended keys (over 5), a slot out of range.
    const body = validBody(cache.id);
    body.metadata.slot_mapping = [0, 1, 2, 12, NB * BS];
    const e = await expectProblem(srv.client.forward(body), 422, "invalid_batch");
    assert.deepEqual(e.problem.issues!.map((i) => `${i.path.join(".")}: ${i.message}`), [
      `metadata.slot_mapping.4: slot ${NB * BS} out of range: -1 or [0, ${
        NB * BS
      }) (num_blocks ${NB} x block_size ${BS})`,
      "query.shape.0: num_tokens 5 exceeds max_tokens = 4",
      "metadata.seq_lens: attended keys 9 exceeds max_attended_keys = 5",
    ]);
    const doc = e.problem as unknown as Record<string, unknown>;
    assert.deepEqual([doc.limit, doc.value, doc.max], ["max_tokens", 5, 4]);
    // The same call with a valid slot: only the limits, 422 limit_exceeded listing both.
    const lim = await expectProblem(srv.client.forward(validBody(cache.id)), 422, "limit_exceeded");
    assert.deepEqual(lim.problem.issues!.map((i) => i.path.join(".")), [
      "query.shape.0",
      "metadata.seq_lens",
    ]);
    // An unknown cache is a 404 first, whatever else is wrong (the spec to check against is
    // the cache's).
    body.kv_cache = "nope";
    await expectProblem(srv.client.forward(body), 404, "cache_not_found");
    assert.equal(await cacheSnapshot(srv, cache.id), before, "no rejected call changed the cache");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("errors: bodies over the limit → 413, by Content-Length and while streaming", async () => {
  const srv = await startServer({ maxBodyBytes: 2048 });
  try {
    const big = JSON.stringify(validBody());
    assert.ok(big.length > 2048);
    const r = await raw(srv, "/v1/attention/forward", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: big,
    });
    assertProblem(r, 413, "body_too_large");
    // Chunked: no Content-Length, the limit is enforced while reading.
    const bytes = new TextEncoder().encode(big);
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < bytes.length; i += 512) c.enqueue(bytes.slice(i, i + 512));
        c.close();
      },
    });
    const r2 = await raw(srv, "/v1/attention/forward", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: stream,
    });
    assertProblem(r2, 413, "body_too_large");
    assert.equal(r2.body.max_body_bytes, 2048);
    // A small body still works on the same server, chunked too.
    const sel = await srv.client.select({ head_size: 8, dtype: "float32" });
    assert.equal(sel.backend, "CPU_REFERENCE");
    const small = new TextEncoder().encode(JSON.stringify({ head_size: 8, dtype: "float32" }));
    const chunked = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < small.length; i += 7) c.enqueue(small.slice(i, i + 7));
        c.close();
      },
    });
    const r3 = await fetch(`${srv.url}/v1/backends/select`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: chunked,
    });
    assert.equal(r3.status, 200);
    assert.equal((await r3.json()).backend, "CPU_REFERENCE");
  } finally {
    await srv.close();
  }
});

Deno.test("errors: an unexpected failure is a generic 500, logged, no stack; server stays up", async () => {
  const be = fakeBackend("EXPLODES");
  be.run = () => Promise.reject(new Error("secret internals at line 42"));
  const srv = await startServer({ backends: [be as AttentionBackend] });
  try {
    const body = validBody();
    delete body.kv_cache;
    body.key_cache = {
      dtype: "float32",
      shape: [NB, BS, HKV, D],
      data: new Array(NB * BS * HKV * D).fill(0),
    };
    body.value_cache = body.key_cache;
    const r = await raw(srv, "/v1/attention/forward", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    assertProblem(r, 500, "internal_error");
    assert.ok(!JSON.stringify(r.body).includes("secret"), "no internals leak");
    assert.equal(srv.errors.length, 1, "logged server-side");
    assert.match(String(srv.errors[0]), /secret internals/);
    assert.deepEqual(await srv.client.health(), { status: "ok" });
  } finally {
    await srv.close();
  }
});
