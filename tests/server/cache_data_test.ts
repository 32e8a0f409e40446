/**
 * PUT /v1/kv-caches/{id}/data over a real port (CPU_REFERENCE): the inverse of GET .../data
 * (export one cache, import into another, same bytes, same next step against float64, across
 * storage dtypes and layouts), and every refusal — wrong shape, dtype or metadata, missing or
 * unknown tensors, not safetensors, JSON, too large, unknown cache, over the memory budget —
 * leaves the target's bytes as they were.
 */
import assert from "node:assert/strict";
import { serializeSafetensors } from "../../core/safetensors.ts";
import type { KvCacheDType, KvLayout } from "../../core/types.ts";
import { expectProblem, maxAbsDiff, startServer, type TestServer } from "./helpers.ts";
import { HeldSeq } from "./held_seq.ts";

const bytesOf = async (srv: TestServer, id: string) => {
  const r = await fetch(`${srv.url}/v1/kv-caches/${id}/data`);
  assert.equal(r.status, 200);
  return new Uint8Array(await r.arrayBuffer());
};

Deno.test("PUT .../data: an export imports into another cache; the next step matches float64", async () => {
  const srv = await startServer();
  try {
    const spec = HeldSeq.cacheSpec();
    await srv.client.putCache("src", spec);
    const seq = new HeldSeq();
    for (const n of [6, 1, 2]) await srv.client.forwardOn("src", seq.step(n).body);
    const exported = await bytesOf(srv, "src");
    await srv.client.putCache("dst", spec);
    const info = await srv.client.putCacheData("dst", exported);
    assert.equal(info.id, "dst");
    const a = await srv.client.cacheData("src"), b = await srv.client.cacheData("dst");
    assert.deepEqual(b.key_cache.data, a.key_cache.data);
    assert.deepEqual(b.value_cache.data, a.value_cache.data);
    assert.equal(b.metadata.id, "dst");
    // The same step on both: each matches the reference over the whole history.
    const { body, ref } = seq.step(1);
    for (const id of ["src", "dst"]) {
      const ans = await srv.client.forwardOn(id, body);
      assert.ok(maxAbsDiff(ans.output.values, ref) < 2e-5, id);
    }
    assert.equal(srv.service.caches.usedBytes, 2 * info.bytes, "the old storage was freed");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("PUT .../data: storage dtypes and layouts round-trip byte for byte (parsed or as bytes)", async () => {
  const srv = await startServer();
  try {
    const cases: [KvCacheDType, "float16" | "bfloat16" | "float32", KvLayout][] = [
      ["fp8_e4m3", "float16", "HND"],
      ["fp8_e5m2", "bfloat16", "NHD"],
      ["auto", "bfloat16", "HND"],
      ["float16", "float32", "NHD"],
    ];
    for (const [kv, dtype, layout] of cases) {
      const spec = { ...HeldSeq.cacheSpec(), dtype, kv_cache_dtype: kv, layout };
      const name = `${kv}-${dtype}-${layout}`;
      await srv.client.putCache(`${name}-a`, spec);
      await srv.client.putCache(`${name}-b`, spec);
      // Fill a with random bytes of its storage dtype (an import from anywhere), then copy to b.
      const a = await srv.client.cacheData(`${name}-a`);
      for (const t of [a.key_cache, a.value_cache]) {
        for (let i = 0; i < t.data.length; i++) t.data[i] = (i * 37 + 11) & 0x7b; // finite
      }
      const info = await srv.client.getCache(`${name}-a`);
      await srv.client.putCacheData(`${name}-a`, {
        info,
        shape: a.key_cache.shape,
        key: a.key_cache.data,
        value: a.value_cache.data,
      });
      await srv.client.putCacheData(`${name}-b`, await bytesOf(srv, `${name}-a`));
      const b = await srv.client.cacheData(`${name}-b`);
      assert.deepEqual(b.key_cache.data, a.key_cache.data, name);
      assert.deepEqual(b.value_cache.data, a.value_cache.data, name);
      assert.deepEqual(b.key_cache.shape, a.key_cache.shape, name);
    }
  } finally {
    await srv.close();
  }
});

Deno.test("PUT .../data: every refusal is a problem naming the field and changes nothing", async () => {
  const srv = await startServer({ maxBodyBytes: 64 * 1024 });
  try {
    const spec = HeldSeq.cacheSpec();
    await srv.client.putCache("t", spec);
    await srv.client.forwardOn("t", new HeldSeq().step(5).body);
    const before = await bytesOf(srv, "t");
    const good = await srv.client.cacheData("t");
    const file = (tensors: Record<string, typeof good.key_cache>, meta = good.metadata) =>
      serializeSafetensors(tensors, meta);
    const { key_cache: k, value_cache: v } = good;
    const put = (body: Uint8Array) => srv.client.putCacheData("t", body);

    let e = await expectProblem(
      put(file({ key_cache: { ...k, shape: [3, 4, 1, 16] }, value_cache: v })),
      422,
      "cache_data_mismatch",
      ["key_cache", "shape"],
    );
    assert.match(e.problem.issues![0].message, /\[3,4,1,16\] but cache t \(NHD\) is \[6,4,1,8\]/);
    e = await expectProblem(
      put(file({ key_cache: k, value_cache: { ...v, dtype: "F16", data: v.data.slice(0, 384) } })),
      422,
      "cache_data_mismatch",
      ["value_cache", "dtype"],
    );
    assert.match(e.problem.detail, /F16 but cache t stores F32/);
    await expectProblem(
      put(file({ key_cache: k, value_cache: v }, { ...good.metadata, layout: "HND" })),
      422,
      "cache_data_mismatch",
      ["__metadata__", "layout"],
    );
    await expectProblem(
      put(file({ key_cache: k, value_cache: v }, { kv_cache_dtype: "fp8_e4m3" })),
      422,
      "cache_data_mismatch",
      ["__metadata__", "kv_cache_dtype"],
    );
    await expectProblem(put(file({ key_cache: k })), 400, "invalid_request", ["value_cache"]);
    await expectProblem(
      put(file({ key_cache: k, value_cache: v, extra: k })),
      400,
      "invalid_request",
      ["extra"],
    );
    await expectProblem(put(new Uint8Array([1, 2, 3])), 400, "bad_safetensors");
    await expectProblem(
      srv.client.putCacheData("nope", before),
      404,
      "cache_not_found",
    );
    const asJson = await fetch(`${srv.url}/v1/kv-caches/t/data`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(asJson.status, 415);
    assert.equal((await asJson.json()).code, "unsupported_media_type");
    const big = await fetch(`${srv.url}/v1/kv-caches/t/data`, {
      method: "PUT",
      headers: { "content-type": "application/octet-stream" },
      body: new Uint8Array(64 * 1024 + 1),
    });
    assert.equal(big.status, 413);
    assert.equal((await big.json()).code, "body_too_large");
    assert.deepEqual(await bytesOf(srv, "t"), before, "the cache is unchanged");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("PUT .../data: a cache whose export is over --max-body-bytes: the 413 names its bytes and the flag", async () => {
  // An audit: a cache the budget allows exported fine and could not come back, with only the
  // generic body limit for a reason.
  const srv = await startServer({ maxBodyBytes: 16 * 1024 });
  try {
    const spec = { ...HeldSeq.cacheSpec(), num_blocks: 128 };
    const { info } = await srv.client.putCache("big", spec);
    assert.ok(info.bytes > 16 * 1024, `${info.bytes} bytes`);
    const exported = await bytesOf(srv, "big");
    assert.ok(exported.byteLength > info.bytes && exported.byteLength < info.bytes + 1024);
    const e = await expectProblem(srv.client.putCacheData("big", exported), 413, "body_too_large");
    assert.equal(e.problem.max_body_bytes, 16 * 1024);
    assert.equal(e.problem.cache_bytes, info.bytes);
    assert.match(e.problem.detail ?? "", new RegExp(`holds ${info.bytes} bytes`));
    assert.match(
      e.problem.detail ?? "",
      new RegExp(`--max-body-bytes of at least ${info.bytes + 1024}`),
    );
    assert.deepEqual(await bytesOf(srv, "big"), exported, "the cache is unchanged");
    // A small cache's oversized body keeps the plain message (its export fits the limit).
    await srv.client.putCache("small", HeldSeq.cacheSpec());
    const plain = await expectProblem(
      srv.client.putCacheData("small", new Uint8Array(16 * 1024 + 1)),
      413,
      "body_too_large",
    );
    assert.equal(plain.problem.cache_bytes, undefined);
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("PUT .../data: the import needs room for a second copy while it is built (422, unchanged)", async () => {
  const bytes = 2 * 6 * 4 * 1 * 8 * 4; // K + V of HeldSeq's float32 cache
  const srv = await startServer({ memoryBudgetBytes: bytes + bytes / 2 });
  try {
    await srv.client.putCache("full", HeldSeq.cacheSpec());
    await srv.client.forwardOn("full", new HeldSeq().step(3).body);
    const before = await bytesOf(srv, "full");
    const e = await expectProblem(
      srv.client.putCacheData("full", before),
      422,
      "memory_budget_exceeded",
    );
    assert.equal(e.problem.requested_bytes, bytes);
    assert.deepEqual(await bytesOf(srv, "full"), before);
    assert.equal(srv.service.caches.usedBytes, bytes, "the reservation was given back");
  } finally {
    await srv.close();
  }
});
