/**
 * The cache-spec rules (core/cache_spec.ts) where a cache is made: a size over int32, which the
 * HTTP schema and the forward validator refuse, is refused by the library's own makers too, as
 * 422 `invalid_cache_spec` naming the field: the service's create answered 422
 * `memory_budget_exceeded` for it (a budget question, for a spec no path should take), and
 * HostKvCache.create threw a bare RangeError (a crash) when the sizes' product was too large to
 * allocate.
 */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import { HostKvCache } from "../../backends/cpu/host_cache.ts";
import { builtinBackends } from "../../backends/index.ts";
import { NoDeviceProvider } from "../../gpu/device.ts";
import { AttentionService } from "../../service/service.ts";

const SPEC: KvCacheSpec = {
  num_blocks: 2,
  block_size: 16,
  num_kv_heads: 1,
  head_size: 32,
  dtype: "float16",
  kv_cache_dtype: "auto",
  layout: "NHD",
};

/** Asserts `e` is the 422 `invalid_cache_spec` naming `field` = 2^31. */
function isOverInt32(e: unknown, field: string): true {
  assert.ok(e instanceof ServiceError, `a ServiceError, not ${e}`);
  assert.equal(e.code, "invalid_cache_spec", e.message);
  assert.equal(e.status, 422);
  assert.deepEqual(e.issues?.[0], {
    path: [field],
    message: "must be an integer in [1, 2147483647], got 2147483648",
  });
  return true;
}

Deno.test("service: a cache size over int32 is 422 invalid_cache_spec, not a budget refusal", async () => {
  const svc = new AttentionService({
    backends: builtinBackends(),
    device: new NoDeviceProvider("a test without a GPU"),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    for (const f of ["num_blocks", "block_size", "num_kv_heads", "head_size"] as const) {
      const spec = { ...SPEC, [f]: 2 ** 31 };
      await assert.rejects(() => svc.createCache(spec), (e) => isOverInt32(e, f));
      await assert.rejects(() => svc.putCache("big", spec), (e) => isOverInt32(e, f));
    }
    assert.throws(() => svc.getCache("big"), /no KV cache with id "big"/, "nothing was made");
  } finally {
    await svc.close();
  }
});

Deno.test("HostKvCache: sizes over int32 are a 422 naming the first, never a RangeError", () => {
  const spec = { ...SPEC, num_blocks: 2 ** 31, block_size: 2 ** 31 };
  const n = 16;
  const makers = [
    () => HostKvCache.create(spec),
    () => HostKvCache.fromBytes(spec, new Uint8Array(n), new Uint8Array(n)),
    () =>
      HostKvCache.attach({
        spec,
        key: new SharedArrayBuffer(n),
        value: new SharedArrayBuffer(n),
      }),
  ];
  for (const make of makers) {
    assert.throws(make, (e) => {
      isOverInt32(e, "num_blocks");
      assert.deepEqual((e as ServiceError).issues?.map((i) => i.path), [
        ["num_blocks"],
        ["block_size"],
      ]);
      return true;
    });
  }
});
