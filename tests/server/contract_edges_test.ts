/**
 * Contract edges an audit against docs/api.md found (each failed before its fix): cache ids
 * `.` and `..` (plain or percent-encoded) are refused as ids instead of being resolved into
 * another path; every forward answer carries `Server-Timing`, a refused one too; a body in a
 * content coding is a 415 that says so; a JSON number beyond float64 in a tensor is the 422 the
 * same value gets as bytes, and messages spell non-finite values instead of `null`.
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { cacheSnapshot, rand, startServer, type TestServer } from "./helpers.ts";
import { rawExchange, rawRequest } from "./raw_http.ts";

const H = 2, HKV = 1, D = 8, BS = 4;

function body(extra: Partial<ForwardBody> = {}): ForwardBody {
  return {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: { dtype: "float32", shape: [2, H, D], data: rand(2 * H * D) },
    key: { dtype: "float32", shape: [2, HKV, D], data: rand(2 * HKV * D) },
    value: { dtype: "float32", shape: [2, HKV, D], data: rand(2 * HKV * D) },
    metadata: { query_start_loc: [0, 2], seq_lens: [2], block_table: [[1]], slot_mapping: [4, 5] },
    ...extra,
  };
}

async function post(srv: TestServer, path: string, b: unknown, headers: Record<string, string>) {
  const res = await fetch(`${srv.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof b === "string" ? b : JSON.stringify(b),
  });
  return { status: res.status, headers: res.headers, doc: await res.json() };
}

Deno.test("contract edges: dot-segment ids, Server-Timing, content codings, non-finite JSON numbers", async (t) => {
  const srv = await startServer();
  try {
    await srv.client.putCache("c", {
      num_blocks: 4,
      block_size: BS,
      num_kv_heads: HKV,
      head_size: D,
      dtype: "float32",
    });
    const before = await cacheSnapshot(srv, "c");

    await t.step(
      "`.` and `..` ids, plain or percent-encoded, are 400 invalid_cache_id",
      async () => {
        for (
          const [method, path] of [
            ["GET", "/v1/kv-caches/%2e%2e"],
            ["GET", "/v1/kv-caches/."],
            ["DELETE", "/v1/kv-caches/.."],
            ["GET", "/v1/kv-caches/%2E/data"],
            ["PUT", "/v1/kv-caches/%2e%2e"],
            ["POST", "/v1/kv-caches/../forward"],
          ]
        ) {
          const b = method === "PUT" || method === "POST" ? "{}" : undefined;
          const r = await rawExchange(
            srv.port,
            rawRequest(method, path, b ? { "content-type": "application/json" } : {}, b),
          );
          assert.ok(r, `${method} ${path}: no answer`);
          const doc = JSON.parse(r.text);
          assert.equal(r.status, 400, `${method} ${path}: ${r.text}`);
          assert.equal(doc.code, "invalid_cache_id", `${method} ${path}`);
          const value = decodeURIComponent(path.split("/")[3]);
          assert.deepEqual(doc.issues[0].path, ["id"]);
          assert.ok(doc.issues[0].message.includes(JSON.stringify(value)), doc.issues[0].message);
        }
        // A dot segment elsewhere is not resolved either: no route, not /v1/device.
        const r = await rawExchange(srv.port, rawRequest("GET", "/v1/x/../device", {}));
        assert.equal(r?.status, 404, r?.text);
      },
    );

    await t.step("every forward answer carries Server-Timing, refused ones too", async () => {
      const timing = /^parse;dur=\d+\.\d{3}$/;
      const ok = await post(srv, "/v1/kv-caches/c/forward", body(), {});
      assert.equal(ok.status, 200, JSON.stringify(ok.doc));
      assert.match(ok.headers.get("server-timing") ?? "", timing);
      const refused = [
        await post(srv, "/v1/kv-caches/c/forward", body({ dtype: "float16" }), {}), // 422
        await post(srv, "/v1/attention/forward", { dtype: "float32" }, {}), // 400 schema
        await post(srv, "/v1/attention/forward", "{", {}), // 400 malformed
        await post(srv, "/v1/kv-caches/nope/forward", body(), {}), // 404 cache
        await post(srv, "/v1/attention/forward", body(), { "content-type": "text/plain" }), // 415
        await post(srv, "/v1/kv-caches/_bad/forward", body(), {}), // 400 invalid_cache_id
      ];
      assert.deepEqual(refused.map((r) => r.status), [422, 400, 400, 404, 415, 400]);
      for (const r of refused) {
        assert.match(r.headers.get("server-timing") ?? "", timing, JSON.stringify(r.doc));
      }
    });

    await t.step("a body in a content coding is a 415 naming the coding", async () => {
      const beforeCodings = await cacheSnapshot(srv, "c");
      for (const coding of ["gzip", "br, identity", "deflate"]) {
        const r = await post(srv, "/v1/kv-caches/c/forward", body(), {
          "content-encoding": coding,
        });
        assert.equal(r.status, 415, JSON.stringify(r.doc));
        assert.equal(r.doc.code, "unsupported_content_encoding");
        assert.equal(r.doc.content_encoding, coding);
        assert.equal(r.headers.get("accept-encoding"), "identity");
      }
      const sel = await post(srv, "/v1/backends/select", { head_size: 8, dtype: "float32" }, {
        "content-encoding": "gzip",
      });
      assert.equal(sel.status, 415);
      assert.equal(await cacheSnapshot(srv, "c"), beforeCodings, "refused codings wrote nothing");
      const identity = await post(srv, "/v1/kv-caches/c/forward", body(), {
        "content-encoding": "identity",
      });
      assert.equal(identity.status, 200, JSON.stringify(identity.doc));
    });

    const afterOk = await cacheSnapshot(srv, "c");
    assert.notEqual(afterOk, before, "the accepted calls wrote their K/V");

    await t.step(
      "a JSON number beyond float64 in a tensor is 422 invalid_batch, as bytes are",
      async () => {
        const text = JSON.stringify(body()).replace(/("query":\{[^}]*"data":\[)[^,]+/, "$11e400");
        assert.ok(text.includes("[1e400,"), "the body spells 1e400");
        const r = await post(srv, "/v1/kv-caches/c/forward", text, {});
        assert.equal(r.status, 422, JSON.stringify(r.doc));
        assert.equal(r.doc.code, "invalid_batch");
        const issue = r.doc.issues.find((i: { path: unknown[] }) => i.path[0] === "query");
        assert.ok(issue, JSON.stringify(r.doc.issues));
        assert.match(issue.message, /element 0 is Infinity/);
        const neg = await post(srv, "/v1/kv-caches/c/forward", text.replace("1e400", "-1e400"), {});
        assert.equal(neg.status, 422, JSON.stringify(neg.doc));
        assert.equal(await cacheSnapshot(srv, "c"), afterOk, "refused calls wrote nothing");
      },
    );

    // Was a 400 invalid_request from the schema ("expected number, received Infinity"), where
    // docs/api.md promises the layer's float32 rule's 422 and tensor data got it.
    await t.step(
      "a JSON number beyond float64 in a layer value is the 422 of its rule",
      async () => {
        const layer = '"layer":{"num_heads":2,"num_kv_heads":1,"head_size":8';
        const text = JSON.stringify(body());
        assert.ok(text.includes(layer), text.slice(0, 200));
        for (
          const [field, path] of [
            ['"scale":1e400', ["layer", "scale"]],
            ['"logits_soft_cap":-1e400', ["layer", "logits_soft_cap"]],
            ['"sinks":[0,1e400]', ["layer", "sinks", 1]],
            ['"alibi_slopes":[-1e400,0]', ["layer", "alibi_slopes", 0]],
            ['"k_scale":1e400', ["layer", "k_scale"]],
          ] as const
        ) {
          const r = await post(
            srv,
            "/v1/kv-caches/c/forward",
            text.replace(layer, `${layer},${field}`),
            {},
          );
          assert.equal(r.status, 422, `${field}: ${JSON.stringify(r.doc)}`);
          assert.equal(r.doc.code, "invalid_batch", field);
          assert.deepEqual(r.doc.issues[0].path, path, `${field}: ${JSON.stringify(r.doc.issues)}`);
          assert.match(r.doc.issues[0].message, /Infinity/, field);
        }
        // A string is still the schema's 400.
        const s = await post(
          srv,
          "/v1/kv-caches/c/forward",
          text.replace(layer, `${layer},"scale":"x"`),
          {},
        );
        assert.equal(s.status, 400, JSON.stringify(s.doc));
        assert.deepEqual(s.doc.issues[0].path, ["layer", "scale"]);
        assert.equal(await cacheSnapshot(srv, "c"), afterOk, "refused calls wrote nothing");
      },
    );

    await t.step("a huge backend name is a short 400, not echoed back", async () => {
      // A 60 MB name came back three times in a 180 MB 404 (an audit).
      const name = "X".repeat(100_000);
      for (
        const [path, b] of [
          ["/v1/backends/select", { head_size: 8, dtype: "float32", backend: name }],
          ["/v1/kv-caches/c/forward", { ...body(), backend: name }],
          ["/v1/kv-caches", {
            num_blocks: 1,
            block_size: 4,
            num_kv_heads: 1,
            head_size: 8,
            dtype: "float32",
            backend: name,
          }],
        ] as const
      ) {
        const res = await fetch(`${srv.url}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(b),
        });
        const text = await res.text();
        assert.equal(res.status, 400, `${path}: ${text.slice(0, 200)}`);
        assert.ok(text.length < 4000, `${path}: a ${text.length}-byte answer`);
        assert.deepEqual(JSON.parse(text).issues[0].path, ["backend"]);
      }
    });

    await t.step("messages spell a non-finite value instead of null", async () => {
      const r = await post(srv, "/v1/backends/select", '{"head_size":1e400,"dtype":"float32"}', {});
      assert.equal(r.status, 400, JSON.stringify(r.doc));
      const issue = r.doc.issues.find((i: { path: unknown[] }) => i.path[0] === "head_size");
      // As written: JSON.parse's Infinity is not what the client sent (wire/json_literals.ts).
      assert.match(issue.message, /got 1e400$/);
      // In an integer metadata tensor too (its message printed JSON's null).
      const text = JSON.stringify(body()).replace(
        '"query_start_loc":[0,2]',
        '"query_start_loc":{"dtype":"int32","shape":[2],"data":[0,1e400]}',
      );
      assert.ok(text.includes("[0,1e400]"), "the body spells 1e400");
      const m = await post(srv, "/v1/kv-caches/c/forward", text, {});
      assert.equal(m.status, 400, JSON.stringify(m.doc));
      assert.match(m.doc.detail, /query_start_loc\.data\.1: value 1e400 is not an int32/);
    });
  } finally {
    await srv.close();
  }
});
