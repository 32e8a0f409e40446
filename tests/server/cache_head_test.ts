/**
 * HEAD /v1/kv-caches/{id}/data over a real port (CPU_REFERENCE): the GET's status and headers
 * (its exact Content-Length, type and disposition) answered from the cache's spec, without
 * reading the cache; an unknown cache is the GET's 404. And the GET's export, now sent as its
 * parts, is the same file byte for byte as the one-buffer form the client builds.
 * @module
 */
import assert from "node:assert/strict";
import type { KvCacheDType, KvLayout } from "../../core/types.ts";
import { cacheSafetensors } from "../../wire/cache_file.ts";
import { startServer } from "./helpers.ts";
import { HeldSeq } from "./held_seq.ts";

Deno.test("HEAD .../data: the export's length and headers, the cache not read", async () => {
  const srv = await startServer();
  const service = srv.service as unknown as { cacheData: (id: string) => Promise<unknown> };
  const read = service.cacheData.bind(srv.service);
  let reads = 0;
  service.cacheData = (id) => (reads++, read(id));
  try {
    const cases: [KvCacheDType, "float16" | "bfloat16" | "float32", KvLayout, number][] = [
      ["fp8_e4m3", "float16", "HND", 8],
      ["auto", "bfloat16", "NHD", 3],
      ["float16", "float32", "HND", 17],
    ];
    for (const [kv, dtype, layout, blocks] of cases) {
      const id = `head-${kv}-${dtype}-${layout}`;
      const spec = {
        ...HeldSeq.cacheSpec(),
        num_blocks: blocks,
        dtype,
        kv_cache_dtype: kv,
        layout,
      };
      await srv.client.putCache(id, spec);
      const url = `${srv.url}/v1/kv-caches/${id}/data`;
      const head = await fetch(url, { method: "HEAD" });
      await head.body?.cancel();
      assert.equal(reads, 0, `${id}: the HEAD read the cache`);
      const get = await fetch(url);
      const bytes = new Uint8Array(await get.arrayBuffer());
      assert.equal(reads, 1, id);
      reads = 0;
      assert.equal(head.status, 200, id);
      for (const h of ["content-type", "content-disposition", "content-length"]) {
        assert.equal(head.headers.get(h), get.headers.get(h), `${id}: ${h}`);
      }
      assert.equal(Number(head.headers.get("content-length")), bytes.byteLength, id);
      // The parts sent are the file the client's one-buffer form makes of the same contents.
      const data = await srv.client.cacheData(id);
      reads = 0;
      const info = await srv.client.getCache(id);
      const whole = cacheSafetensors({
        info,
        shape: data.key_cache.shape,
        key: data.key_cache.data,
        value: data.value_cache.data,
      });
      assert.deepEqual(bytes, whole, id);
    }
    const missing = await fetch(`${srv.url}/v1/kv-caches/no-such-cache/data`, { method: "HEAD" });
    await missing.body?.cancel();
    assert.equal(missing.status, 404);
    assert.equal(reads, 0);
  } finally {
    await srv.close();
  }
});
