/**
 * Defects a black-box review of the HTTP API found (each failed before its fix): a forced GPU
 * backend on a server with no device by configuration answered a 503 with `Retry-After` and
 * was logged as a service error, though no retry can help; `bad_safetensors` problems had no
 * `issues`; a JSON number that overflows its tensor's own dtype was reported in the call's
 * dtype; a forward on a missing cache (`/v1/kv-caches/{id}/forward`) with a body that does not
 * decode was a 400, not docs/api.md's 404 "whatever else is wrong with it"; and a forced
 * backend that cannot read a held cache's storage is 422 `no_valid_backend` with the
 * selector's reason (docs/api.md named `cache_storage_mismatch`, the library's answer).
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { builtinBackends } from "../../backends/index.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { MANAGER, NO_GPU } from "../support/gpu.ts";
import { rand, startServer, type TestServer } from "./helpers.ts";
import { handSafetensors } from "../support/hand_safetensors.ts";

const H = 2, HKV = 1, D = 4, BS = 16;
const SPEC = {
  num_blocks: 8,
  block_size: BS,
  num_kv_heads: HKV,
  head_size: D,
  dtype: "float32",
} as const;

function body(extra: Record<string, unknown> = {}, d = D): ForwardBody {
  return {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: d },
    query: { dtype: "float32", shape: [2, H, d], data: rand(2 * H * d) },
    key: { dtype: "float32", shape: [2, HKV, d], data: rand(2 * HKV * d) },
    value: { dtype: "float32", shape: [2, HKV, d], data: rand(2 * HKV * d) },
    metadata: {
      query_start_loc: [0, 1, 2],
      seq_lens: [1, 1],
      block_table: [[0], [1]],
      slot_mapping: [0, 16],
    },
    ...extra,
  } as ForwardBody;
}

async function send(
  srv: TestServer,
  method: string,
  path: string,
  b: unknown,
  headers: Record<string, string> = { "content-type": "application/json" },
) {
  const res = await fetch(`${srv.url}${path}`, {
    method,
    headers,
    body: b instanceof Uint8Array
      ? b as Uint8Array<ArrayBuffer>
      : typeof b === "string"
      ? b
      : JSON.stringify(b),
  });
  return { status: res.status, headers: res.headers, doc: await res.json() };
}

Deno.test("review: a forced GPU backend on a server without a device: 503, no Retry-After, not logged", async () => {
  const srv = await startServer({ backends: builtinBackends() });
  try {
    await srv.client.putCache("c", SPEC);
    const gpu = (await srv.client.backends()).find((b) => b.available === false)!.name;
    for (
      const [method, path, b] of [
        ["POST", "/v1/backends/select", { head_size: 64, dtype: "float16", backend: gpu }],
        ["PUT", "/v1/kv-caches/g", { ...SPEC, backend: gpu }],
        ["POST", "/v1/kv-caches", { ...SPEC, backend: gpu }],
        ["POST", "/v1/kv-caches/c/forward", body({ backend: gpu })],
      ] as const
    ) {
      const before = srv.errors.length;
      const r = await send(srv, method, path, b);
      const where = `${method} ${path}: ${JSON.stringify(r.doc)}`;
      assert.equal(r.status, 503, where);
      assert.equal(r.doc.code, "device_unavailable", where);
      assert.equal(r.headers.get("retry-after"), null, `${where}: Retry-After on a permanent 503`);
      assert.equal(r.doc.retryable, false, where);
      assert.match(r.doc.detail, new RegExp(`backend ${gpu} needs a WebGPU device`), where);
      assert.equal(r.doc.error_id, undefined, `${where}: logged as a service error`);
      assert.equal(srv.errors.length, before, `${where}: logged`);
    }
  } finally {
    await srv.close();
  }
});

Deno.test("review: bad_safetensors problems list issues naming the field and its value", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("c", SPEC);
    const q = { dtype: "F32", shape: [2], data_offsets: [0, 8] };
    const k = { dtype: "F32", shape: [2], data_offsets: [8, 16] };
    const meta = { request: JSON.stringify({ dtype: "float32" }) };
    const cases: [string, Uint8Array, string[], RegExp][] = [
      [
        "offsets past the end",
        handSafetensors(
          { __metadata__: meta, query: { ...q, data_offsets: [0, 1000] } },
          new Uint8Array(8),
        ),
        ["query", "data_offsets"],
        /\[0,1000\].*8-byte data section/,
      ],
      [
        "overlapping offsets",
        handSafetensors({ query: q, key: { ...k, data_offsets: [4, 12] } }, new Uint8Array(12)),
        ["key", "data_offsets"],
        /\[4, 12\) overlaps tensor query/,
      ],
      [
        "unknown dtype",
        handSafetensors({ query: { ...q, dtype: "F99" } }, new Uint8Array(8)),
        ["query", "dtype"],
        /"F99"/,
      ],
      [
        "bad shape",
        handSafetensors({ query: { ...q, shape: [-2] } }, new Uint8Array(8)),
        ["query", "shape"],
        /\[-2\]/,
      ],
      [
        "bytes vs dtype x shape",
        handSafetensors({ query: { ...q, shape: [3] } }, new Uint8Array(8)),
        ["query", "data_offsets"],
        /8 bytes but F32 x \[3\] needs 12/,
      ],
      [
        "non-string __metadata__.request",
        handSafetensors(
          { __metadata__: { request: { dtype: "float32" } }, query: q },
          new Uint8Array(8),
        ),
        ["__metadata__", "request"],
        /must be a string, got \{"dtype":"float32"\}/,
      ],
      [
        "trailing bytes",
        handSafetensors({ query: q }, new Uint8Array(15)),
        ["data"],
        /\[8, 15\) belong to no tensor/,
      ],
      [
        "a gap before a tensor",
        handSafetensors({ query: { ...q, data_offsets: [4, 12] } }, new Uint8Array(12)),
        ["query", "data_offsets"],
        /\[0, 4\) belong to no tensor/,
      ],
      ["header length past the end", handSafetensors({ query: q }, new Uint8Array(8), 1000n), [
        "header_length",
      ], /1000/],
      [
        "header length huge",
        handSafetensors({}, new Uint8Array(0), 1n << 63n),
        ["header_length"],
        /9223372036854775808/,
      ],
      [
        "header not JSON",
        handSafetensors("notjson!", new Uint8Array(0)),
        ["header"],
        /not valid UTF-8 JSON/,
      ],
      [
        "header a JSON array",
        handSafetensors("[1,2,3] ", new Uint8Array(0)),
        ["header"],
        /\[1,2,3\]/,
      ],
      ["7 bytes", new Uint8Array(7), ["header_length"], /7 bytes/],
    ];
    for (const [name, bytes, path, message] of cases) {
      for (const route of ["/v1/kv-caches/c/forward", "/v1/kv-caches/c/data"]) {
        const r = await send(srv, route.endsWith("data") ? "PUT" : "POST", route, bytes, {
          "content-type": "application/octet-stream",
        });
        const where = `${name} (${route}): ${JSON.stringify(r.doc)}`;
        assert.equal(r.status, 400, where);
        assert.equal(r.doc.code, "bad_safetensors", where);
        assert.ok(Array.isArray(r.doc.issues) && r.doc.issues.length > 0, `${where}: no issues`);
        assert.deepEqual(r.doc.issues[0].path, path, where);
        assert.match(r.doc.issues[0].message, message, where);
      }
    }
    // Every bad tensor is listed, one issue each.
    const two = handSafetensors(
      { query: { ...q, dtype: "F99" }, key: { ...k, shape: [-1] }, __metadata__: { a: 1 } },
      new Uint8Array(16),
    );
    const r = await send(srv, "POST", "/v1/kv-caches/c/forward", two, {
      "content-type": "application/octet-stream",
    });
    assert.deepEqual(
      r.doc.issues.map((i: { path: string[] }) => i.path.join(".")).sort(),
      ["__metadata__.a", "key.shape", "query.dtype"],
      JSON.stringify(r.doc),
    );
    assert.match(r.doc.detail, /and 2 more/);
  } finally {
    await srv.close();
  }
});

Deno.test("review: a number that overflows its tensor's own dtype is named in that dtype, with the value sent", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("c", SPEC);
    const cases: [string, Record<string, unknown>, (string | number)[], RegExp][] = [
      [
        "float16 query in a float32 call",
        { query: { dtype: "float16", shape: [2, H, D], data: [70000, ...rand(2 * H * D - 1)] } },
        ["query", 0],
        /element 0 is 70000, which overflows float16/,
      ],
      [
        "bfloat16 key in a float32 call",
        {
          key: {
            dtype: "bfloat16",
            shape: [2, HKV, D],
            data: [0, -1e39, ...rand(2 * HKV * D - 2)],
          },
        },
        ["key", 1],
        /element 1 is -1e\+39, which overflows bfloat16/,
      ],
      [
        "float32 value past float32",
        { value: { dtype: "float32", shape: [2, HKV, D], data: [0, 0, 1e39, ...rand(5)] } },
        ["value", 2],
        /element 2 is 1e\+39, which overflows float32/,
      ],
      [
        "a number beyond float64 keeps its message",
        // 12345.5 stands for 1e400 (JSON.stringify would write null), put in the text below.
        { query: { dtype: "float16", shape: [2, H, D], data: [12345.5, ...rand(2 * H * D - 1)] } },
        ["query", 0],
        /element 0 is Infinity in float16/,
      ],
    ];
    for (const [name, extra, path, message] of cases) {
      const text = JSON.stringify(body(extra)).replace("12345.5", "1e400");
      const r = await send(srv, "POST", "/v1/kv-caches/c/forward", text);
      const where = `${name}: ${JSON.stringify(r.doc)}`;
      assert.equal(r.status, 422, where);
      assert.equal(r.doc.code, "invalid_batch", where);
      assert.deepEqual(r.doc.issues[0].path, path, where);
      assert.match(r.doc.issues[0].message, message, where);
    }
    // A float32 value finite in its own dtype that overflows the call's float16.
    await srv.client.putCache("h", { ...SPEC, dtype: "float16" });
    const r = await send(
      srv,
      "POST",
      "/v1/kv-caches/h/forward",
      body({
        dtype: "float16",
        query: { dtype: "float32", shape: [2, H, D], data: [1, 1e5, ...rand(2 * H * D - 2)] },
      }),
    );
    assert.equal(r.status, 422, JSON.stringify(r.doc));
    assert.deepEqual(r.doc.issues[0].path, ["query", 1]);
    assert.match(r.doc.issues[0].message, /element 1 is 100000 in float32, Infinity in float16/);
  } finally {
    await srv.close();
  }
});

Deno.test("review: a forward on a missing cache is 404 whatever else is wrong with its body", async () => {
  const srv = await startServer();
  try {
    const bad: [string, unknown, Record<string, string>?][] = [
      ["data/shape mismatch", body({ query: { dtype: "float32", shape: [9], data: [1] } })],
      ["missing field", { ...body(), layer: undefined }],
      ["unknown field", body({ foo: 1 })],
      ["malformed JSON", "{"],
      ["not safetensors", new Uint8Array([1, 2, 3]), {
        "content-type": "application/octet-stream",
      }],
      ["unsupported media type", "x", { "content-type": "text/plain" }],
      ["batch rule", body({ metadata: { ...body().metadata, seq_lens: [0, 1] } })],
    ];
    for (const [name, b, headers] of bad) {
      const res = await fetch(`${srv.url}/v1/kv-caches/nope/forward`, {
        method: "POST",
        headers: headers ?? { "content-type": "application/json" },
        body: b instanceof Uint8Array
          ? b as Uint8Array<ArrayBuffer>
          : typeof b === "string"
          ? b
          : JSON.stringify(b),
      });
      const doc = await res.json();
      assert.equal(res.status, 404, `${name}: ${JSON.stringify(doc)}`);
      assert.equal(doc.code, "cache_not_found", name);
      assert.ok(res.headers.get("server-timing")?.startsWith("parse;dur="), name);
    }
  } finally {
    await srv.close();
  }
});

Deno.test({
  name: "review: a forced backend that cannot read a held cache's storage: 422 no_valid_backend",
  ignore: NO_GPU,
  async fn() {
    const srv = await startServer({ backends: builtinBackends(), device: MANAGER });
    try {
      for (
        const [held, forced, storage, uses] of [
          ["WEBGPU_FLASH", CPU_REFERENCE.name, "webgpu", "host"],
          [CPU_REFERENCE.name, "WEBGPU_FLASH", "host", "webgpu"],
        ]
      ) {
        const id = `s-${held}`;
        await srv.client.putCache(id, { ...SPEC, head_size: 64, backend: held });
        const r = await send(
          srv,
          "POST",
          `/v1/kv-caches/${id}/forward`,
          body({ backend: forced }, 64),
        );
        const where = `${forced} on ${held}'s cache: ${JSON.stringify(r.doc)}`;
        assert.equal(r.status, 422, where);
        assert.equal(r.doc.code, "no_valid_backend", where);
        assert.ok(
          r.doc.reasons[forced].includes(
            `kv cache storage ${storage} not supported (backend uses ${uses})`,
          ),
          where,
        );
      }
    } finally {
      await srv.close();
    }
  },
});
