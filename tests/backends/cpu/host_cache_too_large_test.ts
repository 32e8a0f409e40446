/**
 * A host cache with sizes inside the spec rules (core/cache_spec.ts) but too large to hold is
 * the GPU cache's 422 `kv_cache_too_large` (`bytes`: K and V together; `max_bytes` where the
 * limit is known), never a bare RangeError: refused before anything is allocated when one of K
 * or V would pass the 2^53 - 1 B an ArrayBuffer can hold ("Invalid array buffer length"), and
 * when the allocation itself fails ("Array buffer allocation failed"). Every maker (create,
 * fromBytes, attach), the service's create and put, and over HTTP a create within the memory
 * budget (a 500 `internal_error` before).
 */
import assert from "node:assert/strict";
import { ServiceError } from "../../../core/errors.ts";
import type { KvCacheSpec } from "../../../core/types.ts";
import { cacheHalfBytes, HostKvCache } from "../../../backends/cpu/host_cache.ts";
import { CPU_REFERENCE } from "../../../backends/cpu/cpu_reference.ts";
import { builtinBackends } from "../../../backends/index.ts";
import { NoDeviceProvider } from "../../../gpu/device.ts";
import { AttentionService } from "../../../service/service.ts";
import type { AttentionBackend } from "../../../core/types.ts";
import { expectProblem, startServer } from "../../server/helpers.ts";

const MAX = 2 ** 31 - 1;
/**
 * The most bytes one ArrayBuffer (K or V) takes: 2^53 - 1 (V8 on 64-bit; host_cache.ts
 * HOST_CACHE_MAX_TENSOR_BYTES).
 */
const HOST_CACHE_MAX_TENSOR_BYTES = Number.MAX_SAFE_INTEGER;

/** num_blocks = block_size = 2^31 - 1: inside the rules, ~2^64 B per tensor. */
const HUGE: KvCacheSpec = {
  num_blocks: MAX,
  block_size: MAX,
  num_kv_heads: 1,
  head_size: 1,
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
};

/**
 * Exactly 2^53 - 1 B per tensor (fp8: a byte an element; 2^53 - 1 = 20394401 x 69431 x 6361):
 * the most an ArrayBuffer takes, so only the allocation itself can refuse it (8 PiB each).
 */
const AT_LIMIT: KvCacheSpec = {
  num_blocks: 20394401,
  block_size: 69431,
  num_kv_heads: 6361,
  head_size: 1,
  dtype: "float16",
  kv_cache_dtype: "fp8_e4m3",
  layout: "HND",
};

/** Asserts `e` is the 422 `kv_cache_too_large` for `spec`, with `max_bytes` when `over`. */
function tooLarge(e: unknown, spec: KvCacheSpec, over: boolean): true {
  assert.ok(e instanceof ServiceError, `a ServiceError, not ${e}`);
  assert.equal(e.status, 422, e.message);
  assert.equal(e.code, "kv_cache_too_large", e.message);
  const n = cacheHalfBytes(spec);
  assert.equal(e.extra?.bytes, 2 * n);
  if (over) {
    assert.equal(e.extra?.max_bytes, 2 * HOST_CACHE_MAX_TENSOR_BYTES);
    assert.match(e.message, new RegExp(`${spec.num_blocks} blocks needs ${n} B per tensor`));
  } else {
    assert.match(e.message, /could not allocate a host KV cache of \d+ B: /);
  }
  return true;
}

Deno.test("HostKvCache: a spec past the ArrayBuffer limit is 422 kv_cache_too_large from every maker", () => {
  assert.ok(cacheHalfBytes(HUGE) > HOST_CACHE_MAX_TENSOR_BYTES);
  const tiny = new Uint8Array(8);
  const makers = [
    () => HostKvCache.create(HUGE),
    () => HostKvCache.fromBytes(HUGE, tiny, tiny),
    () =>
      HostKvCache.attach({
        spec: HUGE,
        key: new SharedArrayBuffer(8),
        value: new SharedArrayBuffer(8),
      }),
  ];
  for (const make of makers) assert.throws(make, (e) => tooLarge(e, HUGE, true));
  // One byte past the limit in one tensor: refused before allocating, at the edge.
  const over: KvCacheSpec = { ...AT_LIMIT, head_size: 2 };
  assert.throws(() => HostKvCache.create(over), (e) => tooLarge(e, over, true));
});

Deno.test("HostKvCache: an allocation the host cannot make is 422 kv_cache_too_large, not a RangeError", () => {
  assert.equal(cacheHalfBytes(AT_LIMIT), HOST_CACHE_MAX_TENSOR_BYTES);
  assert.throws(() => HostKvCache.create(AT_LIMIT), (e) => tooLarge(e, AT_LIMIT, false));
  // The rules still come first: invalid_cache_spec, not a size answer.
  assert.throws(
    () => HostKvCache.create({ ...HUGE, num_blocks: 2 ** 31 }),
    (e) => e instanceof ServiceError && e.code === "invalid_cache_spec",
  );
  // A small cache is still made.
  const c = HostKvCache.create({ ...HUGE, num_blocks: 2, block_size: 4 });
  assert.equal(c.bytes, 2 * 2 * 4 * 4);
});

/**
 * 2^52 - 1 B per tensor (fp8; 124815 x 4405103 x 8191): K and V together are 2^53 - 2 B, inside
 * the largest memory budget `--memory-budget-bytes` takes (2^53 - 1), so over HTTP the budget
 * lets it through to the allocation, which fails (4 PiB in all).
 */
const IN_BUDGET: KvCacheSpec = {
  num_blocks: 124815,
  block_size: 4405103,
  num_kv_heads: 8191,
  head_size: 1,
  dtype: "bfloat16",
  kv_cache_dtype: "fp8_e5m2",
  layout: "NHD",
};

Deno.test("service: a host cache too large to hold is 422 kv_cache_too_large, its reservation given back", async () => {
  const svc = new AttentionService({
    backends: builtinBackends(),
    device: new NoDeviceProvider("a test without a GPU"),
    memoryBudgetBytes: 2 ** 70,
  });
  try {
    for (const spec of [HUGE, AT_LIMIT, IN_BUDGET]) {
      await assert.rejects(
        () => svc.createCache({ ...spec, backend: "CPU_REFERENCE" }),
        (e) => tooLarge(e, spec, spec === HUGE),
      );
      await assert.rejects(
        () => svc.putCache("big", { ...spec, backend: "CPU_REFERENCE" }),
        (e) => tooLarge(e, spec, spec === HUGE),
      );
    }
    assert.equal(svc.caches.usedBytes, 0, "the reservation was given back");
    assert.deepEqual(svc.caches.list(), []);
  } finally {
    await svc.close();
  }
});

Deno.test("HTTP: a host cache within the budget that cannot be allocated is a 422, not a 500", async () => {
  const srv = await startServer({
    backends: [CPU_REFERENCE as AttentionBackend],
    memoryBudgetBytes: Number.MAX_SAFE_INTEGER,
  });
  try {
    assert.equal(cacheHalfBytes(IN_BUDGET), 2 ** 52 - 1);
    const e = await expectProblem(srv.client.createCache(IN_BUDGET), 422, "kv_cache_too_large");
    assert.equal(e.problem.bytes, 2 * cacheHalfBytes(IN_BUDGET));
    assert.match(e.problem.detail, /could not allocate a host KV cache of 9007199254740990 B/);
    await expectProblem(srv.client.putCache("big", IN_BUDGET), 422, "kv_cache_too_large");
    assert.deepEqual(srv.errors, [], "no server fault logged");
    assert.equal(srv.service.caches.usedBytes, 0);
    assert.deepEqual(srv.service.caches.list(), []);
    // The server still makes a cache that fits.
    const ok = await srv.client.createCache({ ...IN_BUDGET, num_blocks: 1, block_size: 16 });
    assert.equal(ok.bytes, 2 * 16 * 8191);
  } finally {
    await srv.close();
  }
});

Deno.test("HostKvCache: the limit it checks is the ArrayBuffer's", async () => {
  const m = await import("../../../backends/cpu/host_cache.ts");
  assert.equal(m.HOST_CACHE_MAX_TENSOR_BYTES, HOST_CACHE_MAX_TENSOR_BYTES);
  assert.throws(() => new SharedArrayBuffer(HOST_CACHE_MAX_TENSOR_BYTES + 1), RangeError);
});
