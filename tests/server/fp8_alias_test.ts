/**
 * `kv_cache_dtype: "fp8"`, vLLM's name for fp8 e4m3 (`--kv-cache-dtype fp8`): a cache made with
 * it stores e4m3 (the same bytes and answers as one made with `fp8_e4m3`, which its PUT matches),
 * keeps the name it was given, and every backend that takes e4m3 takes it.
 * @module
 */
import assert from "node:assert/strict";
import { builtinBackends } from "../../backends/index.ts";
import { resolveStorage } from "../../core/dtype.ts";
import { maxAbsDiff, startServer } from "./helpers.ts";
import { HeldSeq } from "./held_seq.ts";
import { same } from "./fuzz_check.ts";

Deno.test("kv_cache_dtype fp8: e4m3 storage, the name kept, the same bytes and answers", async () => {
  const srv = await startServer();
  try {
    const spec = (kv: "fp8" | "fp8_e4m3" | "fp8_e5m2") => ({
      ...HeldSeq.cacheSpec(),
      kv_cache_dtype: kv,
    });
    // The caches' K/V bytes (their files' metadata name the caches).
    const sameTensors = async (a: string, b: string) => {
      const [x, y] = [await srv.client.cacheData(a), await srv.client.cacheData(b)];
      assert.ok(same(x.key_cache.data, y.key_cache.data), `${a} and ${b}: key_cache`);
      assert.ok(same(x.value_cache.data, y.value_cache.data), `${a} and ${b}: value_cache`);
    };
    const made = await srv.client.putCache("alias", spec("fp8"));
    assert.equal(made.created, true);
    const info = await srv.client.getCache("alias");
    assert.equal(info.kv_cache_dtype, "fp8");
    assert.equal(info.storage_dtype, "fp8_e4m3");
    await srv.client.putCache("named", spec("fp8_e4m3"));
    // The same storage is the same spec; e5m2 is another.
    assert.equal((await srv.client.putCache("alias", spec("fp8_e4m3"))).created, false);
    assert.equal((await srv.client.putCache("named", spec("fp8"))).created, false);
    const conflict = await fetch(`${srv.url}/v1/kv-caches/alias`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(spec("fp8_e5m2")),
    });
    assert.equal(conflict.status, 409);
    assert.equal((await conflict.json()).issues[0].path[0], "kv_cache_dtype");
    const seq = new HeldSeq();
    for (const n of [5, 1, 2]) {
      const { body, ref } = seq.step(n);
      const a = await srv.client.forwardOn("alias", body);
      const b = await srv.client.forwardOn("named", body);
      assert.deepEqual(a.output.values, b.output.values, `step of ${n}: the same answer`);
      // e4m3 keeps 3 mantissa bits: the answer moves from float64's, within fp8's error.
      const err = maxAbsDiff(a.output.values, ref);
      assert.ok(err > 1e-4 && err < 0.15, `step of ${n}: max abs err ${err} vs float64`);
    }
    await sameTensors("alias", "named");
    // The export says fp8 (the name the cache was given); it imports into an e4m3 cache, and an
    // e4m3 export into the fp8 one.
    const data = await srv.client.cacheData("alias");
    assert.equal(data.metadata.kv_cache_dtype, "fp8");
    await srv.client.putCache("moved", spec("fp8_e4m3"));
    await srv.client.putCacheData("moved", data);
    await sameTensors("moved", "alias");
    await srv.client.putCacheData("alias", await srv.client.cacheData("named"));
    await sameTensors("alias", "named");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("kv_cache_dtype fp8: every backend that takes fp8_e4m3 takes fp8, and selects it", () => {
  assert.equal(resolveStorage("fp8", "float16"), "fp8_e4m3");
  assert.equal(resolveStorage("fp8", "float32"), "fp8_e4m3");
  for (const b of builtinBackends()) {
    const kv = b.capabilities.kv_cache_dtypes;
    if (kv.length === 0) continue;
    assert.equal(kv.includes("fp8"), kv.includes("fp8_e4m3"), b.name);
  }
});

Deno.test("kv_cache_dtype fp8 over the selector: CPU_REFERENCE is chosen, no backend refuses the name", async () => {
  const srv = await startServer();
  try {
    const sel = await srv.client.select({
      head_size: 64,
      dtype: "float16",
      kv_cache_dtype: "fp8",
      block_size: 16,
    });
    assert.equal(sel.backend, "CPU_REFERENCE");
    for (const [name, reasons] of Object.entries(sel.rejected ?? {})) {
      for (const r of reasons as string[]) assert.doesNotMatch(r, /kv_cache_dtype/, name);
    }
  } finally {
    await srv.close();
  }
});
