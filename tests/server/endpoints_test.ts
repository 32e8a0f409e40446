/** Every endpoint over a real port: health, device, backends, select, caches, metrics, OpenAPI. */
import assert from "node:assert/strict";
import { parseSafetensors } from "../../core/safetensors.ts";
import { expectProblem, rand, startServer } from "./helpers.ts";

Deno.test("endpoints: health, device, backends, select", async () => {
  const srv = await startServer();
  try {
    assert.deepEqual(await srv.client.health(), { status: "ok" });
    const dev = await srv.client.device();
    assert.equal(dev.available, false);
    assert.equal(typeof dev.runtime, "string");
    const backends = await srv.client.backends();
    const cpu = backends.find((b) => b.name === "CPU_REFERENCE");
    assert.ok(cpu, "CPU_REFERENCE listed");
    assert.equal(cpu.available, true);
    const caps = cpu.capabilities as Record<string, unknown>;
    for (
      const k of [
        "dtypes",
        "kv_cache_dtypes",
        "block_sizes",
        "head_sizes",
        "kv_cache_layouts",
        "attn_types",
      ]
    ) {
      assert.ok(Array.isArray(caps[k]), k);
    }
    const sel = await srv.client.select({
      head_size: 64,
      dtype: "float16",
      kv_cache_dtype: "auto",
      block_size: 16,
    });
    assert.equal(sel.backend, "CPU_REFERENCE");
    assert.equal(sel.block_size, 16);
    assert.equal(typeof sel.rejected, "object");
    const forced = await srv.client.select({
      head_size: 64,
      dtype: "bfloat16",
      backend: "CPU_REFERENCE",
    });
    assert.equal(forced.backend, "CPU_REFERENCE");
    assert.ok(
      Number.isInteger(forced.block_size) && forced.block_size > 0,
      "a preferred block size",
    );
  } finally {
    await srv.close();
  }
});

Deno.test("endpoints: KV cache lifecycle (create 201, get, data, delete 204)", async () => {
  const srv = await startServer();
  try {
    const res = await fetch(`${srv.url}/v1/kv-caches`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        num_blocks: 3,
        block_size: 4,
        num_kv_heads: 2,
        head_size: 8,
        dtype: "bfloat16",
        kv_cache_dtype: "fp8_e4m3",
        layout: "HND",
      }),
    });
    assert.equal(res.status, 201);
    const info = await res.json();
    assert.equal(res.headers.get("location"), `/v1/kv-caches/${info.id}`);
    assert.match(info.id, /^[0-9a-f-]{36}$/);
    assert.equal(info.bytes, 2 * 3 * 4 * 2 * 8);
    assert.equal(info.storage_dtype, "fp8_e4m3");
    assert.equal(info.kv_cache_dtype, "fp8_e4m3");
    assert.equal(info.layout, "HND");
    assert.equal(info.backend, "CPU_REFERENCE");
    assert.equal(info.storage, "host");
    assert.equal(info.lost, false);
    assert.deepEqual(await srv.client.getCache(info.id), info);
    assert.equal(srv.service.caches.usedBytes, info.bytes);
    const data = await srv.client.cacheData(info.id);
    assert.equal(data.key_cache.dtype, "F8_E4M3");
    assert.deepEqual(data.key_cache.shape, [3, 2, 4, 8], "HND shape");
    assert.deepEqual(data.value_cache.shape, [3, 2, 4, 8]);
    assert.equal(data.metadata.id, info.id);
    const r = await fetch(`${srv.url}/v1/kv-caches/${info.id}/data`);
    assert.equal(r.headers.get("content-type"), "application/octet-stream");
    parseSafetensors(new Uint8Array(await r.arrayBuffer()));
    const del = await fetch(`${srv.url}/v1/kv-caches/${info.id}`, { method: "DELETE" });
    assert.equal(del.status, 204);
    assert.equal(await del.text(), "");
    await expectProblem(srv.client.getCache(info.id), 404, "cache_not_found");
    assert.equal(srv.service.caches.usedBytes, 0);
  } finally {
    await srv.close();
  }
});

Deno.test("endpoints: Accept negotiation on forward", async () => {
  const srv = await startServer();
  try {
    const body = {
      dtype: "float32",
      layer: { num_heads: 2, num_kv_heads: 1, head_size: 4, attn_type: "encoder_only" },
      query: { dtype: "float32", shape: [3, 2, 4], data: rand(24) },
      key: { dtype: "float32", shape: [3, 1, 4], data: rand(12) },
      value: { dtype: "float32", shape: [3, 1, 4], data: rand(12) },
      metadata: { query_start_loc: [0, 3], seq_lens: [3] },
      return_lse: true,
    };
    const post = (accept?: string) =>
      fetch(`${srv.url}/v1/attention/forward`, {
        method: "POST",
        headers: {
          "content-type": "application/json; charset=utf-8",
          ...(accept ? { accept } : {}),
        },
        body: JSON.stringify(body),
      });
    const j = await post("application/json");
    assert.equal(j.headers.get("content-type"), "application/json");
    const jb = await j.json();
    assert.equal(jb.output.data.length, 24);
    const b = await post("application/octet-stream");
    assert.equal(b.headers.get("content-type"), "application/octet-stream");
    const file = parseSafetensors(new Uint8Array(await b.arrayBuffer()));
    assert.deepEqual(file.tensors.output.shape, [3, 2, 4]);
    assert.deepEqual(file.tensors.lse.shape, [2, 3]);
    assert.equal(file.metadata.backend, "CPU_REFERENCE");
    assert.equal(typeof JSON.parse(file.metadata.timings).total, "number");
    const out = new Float32Array(file.tensors.output.data.slice().buffer);
    assert.deepEqual(Array.from(out), jb.output.data, "both transports agree");
    const pref = await post("application/octet-stream;q=0.5, application/json");
    assert.equal(pref.headers.get("content-type"), "application/json");
    await pref.body?.cancel();
  } finally {
    await srv.close();
  }
});

Deno.test("endpoints: /metrics counts requests, forwards and cache bytes", async () => {
  const srv = await startServer();
  try {
    await srv.client.health();
    await srv.client.health();
    await fetch(`${srv.url}/nope`).then((r) => r.body?.cancel());
    const c = await srv.client.createCache({
      num_blocks: 2,
      block_size: 4,
      num_kv_heads: 1,
      head_size: 4,
      dtype: "float32",
    });
    await srv.client.forward({
      dtype: "float32",
      layer: { num_heads: 1, num_kv_heads: 1, head_size: 4 },
      query: { dtype: "float32", shape: [1, 1, 4], data: rand(4) },
      key: { dtype: "float32", shape: [1, 1, 4], data: rand(4) },
      value: { dtype: "float32", shape: [1, 1, 4], data: rand(4) },
      metadata: { query_start_loc: [0, 1], seq_lens: [1], block_table: [[1]], slot_mapping: [4] },
      kv_cache: c.id,
    });
    const res = await fetch(`${srv.url}/metrics`);
    assert.match(res.headers.get("content-type")!, /^text\/plain/);
    const text = await res.text();
    assert.match(
      text,
      /attn_http_requests_total\{route="\/healthz",method="GET",status="200"\} 2\n/,
    );
    assert.match(
      text,
      /attn_http_requests_total\{route="unmatched",method="GET",status="404"\} 1\n/,
    );
    assert.match(
      text,
      /attn_http_requests_total\{route="\/v1\/kv-caches",method="POST",status="201"\} 1\n/,
    );
    assert.match(text, /attn_forwards_total\{backend="CPU_REFERENCE"\} 1\n/);
    assert.match(
      text,
      /attn_forward_duration_seconds_bucket\{backend="CPU_REFERENCE",le="\+Inf"\} 1\n/,
    );
    assert.match(text, /attn_forward_duration_seconds_count\{backend="CPU_REFERENCE"\} 1\n/);
    assert.match(text, new RegExp(`attn_kv_cache_bytes ${c.bytes}\\n`));
    assert.match(text, /# TYPE attn_forward_duration_seconds histogram/);
  } finally {
    await srv.close();
  }
});

Deno.test("endpoints: /openapi.json is OpenAPI 3.1 from the request schemas, refs resolve", async () => {
  const srv = await startServer();
  try {
    const doc = await (await fetch(`${srv.url}/openapi.json`)).json();
    assert.equal(doc.openapi, "3.1.0");
    for (
      const p of [
        "/healthz",
        "/v1/device",
        "/v1/backends",
        "/v1/backends/select",
        "/v1/kv-caches",
        "/v1/kv-caches/{id}",
        "/v1/kv-caches/{id}/data",
        "/v1/attention/forward",
        "/metrics",
        "/openapi.json",
      ]
    ) assert.ok(doc.paths[p], p);
    const schemas = doc.components.schemas;
    const fr = schemas.ForwardRequest;
    assert.deepEqual(fr.required.sort(), ["dtype", "layer", "metadata", "query"]);
    assert.equal(fr.additionalProperties, false);
    assert.ok(schemas.SelectRequest.properties.use_mla);
    assert.ok(schemas.Problem.properties.issues);
    const refs: string[] = [];
    const walk = (x: unknown) => {
      if (Array.isArray(x)) x.forEach(walk);
      else if (x && typeof x === "object") {
        for (const [k, v] of Object.entries(x)) k === "$ref" ? refs.push(v as string) : walk(v);
      }
    };
    walk(doc);
    assert.ok(refs.length > 10);
    for (const r of refs) {
      const name = r.replace("#/components/schemas/", "");
      assert.ok(schemas[name], `unresolved ${r}`);
    }
  } finally {
    await srv.close();
  }
});
