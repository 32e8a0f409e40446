/**
 * AttentionService.createCache / putCache refuse a spec the HTTP schema would refuse with the
 * library's own answer, 422 `invalid_cache_spec` naming the field and its value (docs/api.md),
 * before any backend is selected: a head size of 0 went to the selector first (400
 * `invalid_request`), a float64 dtype to whichever backend took it.
 */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import { AttentionService } from "../../service/service.ts";
import { builtinBackends } from "../../backends/index.ts";
import { NoDeviceProvider } from "../../gpu/device.ts";

const SPEC: KvCacheSpec = {
  num_blocks: 2,
  block_size: 16,
  num_kv_heads: 1,
  head_size: 32,
  dtype: "float16",
  kv_cache_dtype: "auto",
  layout: "NHD",
};

Deno.test("service: a cache spec outside the schema is 422 invalid_cache_spec", async () => {
  const svc = new AttentionService({
    backends: builtinBackends(),
    device: new NoDeviceProvider("a test without a GPU"),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    const cases: [Partial<Record<keyof KvCacheSpec, unknown>>, string][] = [
      [{ head_size: 0 }, "head_size"],
      [{ num_blocks: -1 }, "num_blocks"],
      [{ dtype: "float64" }, "dtype"],
      [{ kv_cache_dtype: "int4" }, "kv_cache_dtype"],
    ];
    for (const [bad, field] of cases) {
      const spec = { ...SPEC, ...bad } as unknown as KvCacheSpec;
      for (
        const make of [() => svc.createCache({ ...spec }), () => svc.putCache("x", { ...spec })]
      ) {
        await assert.rejects(make, (e: unknown) => {
          assert.ok(e instanceof ServiceError, String(e));
          assert.equal(e.code, "invalid_cache_spec", `${field}: ${e.message}`);
          assert.deepEqual(e.issues?.[0].path, [field]);
          return true;
        });
      }
    }
    assert.throws(() => svc.getCache("x"), /no KV cache with id "x"/, "nothing was made");
  } finally {
    await svc.close();
  }
});
