/** CacheStore: budget with reservations, per-cache mutex, concurrency across caches, delete. */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import type { KvCacheSpec } from "../../core/types.ts";
import { cacheBytes, CacheStore } from "../../service/cache_store.ts";
import { deferred, fakeBackend } from "./helpers.ts";

const spec = (num_blocks: number): KvCacheSpec => ({
  num_blocks,
  block_size: 4,
  num_kv_heads: 2,
  head_size: 8,
  dtype: "float16",
  kv_cache_dtype: "auto",
  layout: "NHD",
});
const ctx = { gpu: null };

Deno.test("cache store: bytes, budget and reservations", async () => {
  assert.equal(cacheBytes(spec(3)), 2 * 3 * 4 * 2 * 8 * 2);
  assert.equal(cacheBytes({ ...spec(3), kv_cache_dtype: "fp8_e4m3" }), 2 * 3 * 4 * 2 * 8);
  const per = cacheBytes(spec(10)); // 2560
  const store = new CacheStore(per * 2 + 100);
  const be = fakeBackend();
  const a = await store.create(be, spec(10), ctx);
  assert.equal(store.usedBytes, per);
  assert.equal(store.get(a.id), a);
  // Two concurrent creates of which only one fits: exactly one fails, nothing overshoots.
  const results = await Promise.allSettled([
    store.create(be, spec(10), ctx),
    store.create(be, spec(10), ctx),
  ]);
  assert.deepEqual(results.map((r) => r.status).sort(), ["fulfilled", "rejected"]);
  const err = (results.find((r) => r.status === "rejected") as PromiseRejectedResult).reason;
  assert.ok(err instanceof ServiceError);
  assert.equal(err.status, 422);
  assert.equal(err.code, "memory_budget_exceeded");
  assert.equal(err.extra?.requested_bytes, per);
  assert.equal(err.extra?.remaining_bytes, 100);
  assert.equal(store.usedBytes, 2 * per);
  assert.equal(be.created.length, 2, "the rejected create allocated nothing");
  // A failing backend releases its reservation.
  const broken = { ...fakeBackend("BROKEN"), createCache: () => Promise.reject(new Error("boom")) };
  await assert.rejects(store.create(broken, spec(0), ctx), /boom/);
  assert.equal(store.usedBytes, 2 * per);
  await store.delete(a.id);
  assert.equal(store.usedBytes, per);
  assert.ok(a.cache instanceof Object && (a.cache as unknown as { destroyed: boolean }).destroyed);
  assert.throws(
    () => store.get(a.id),
    (e: unknown) => e instanceof ServiceError && e.status === 404,
  );
  await assert.rejects(
    store.delete(a.id),
    (e: unknown) => e instanceof ServiceError && e.code === "cache_not_found",
  );
});

Deno.test("cache store: work on one cache is serialised, other caches run concurrently", async () => {
  const store = new CacheStore(1 << 20);
  const be = fakeBackend();
  const a = await store.create(be, spec(1), ctx), b = await store.create(be, spec(1), ctx);
  const log: string[] = [];
  const gate = deferred();
  const first = store.withCache(a.id, async () => {
    log.push("a1 start");
    await gate.promise;
    log.push("a1 end");
  });
  const second = store.withCache(a.id, () => {
    log.push("a2");
  });
  const other = store.withCache(b.id, () => {
    log.push("b");
  });
  await other; // another cache is not blocked by a1
  assert.deepEqual(log, ["a1 start", "b"]);
  gate.resolve();
  await Promise.all([first, second]);
  assert.deepEqual(log, ["a1 start", "b", "a1 end", "a2"]);
  // An error in one holder does not wedge the mutex.
  await assert.rejects(store.withCache(a.id, () => Promise.reject(new Error("x"))), /x/);
  assert.equal(await store.withCache(a.id, () => 7), 7);
});

Deno.test("cache store: a holder that unlocks lets the next one start, in order", async () => {
  const store = new CacheStore(1 << 20);
  const be = fakeBackend();
  const a = await store.create(be, spec(1), ctx);
  const log: string[] = [];
  const gate = deferred();
  const first = store.withCache(a.id, async (_c, unlock) => {
    log.push("a1 submit");
    unlock();
    unlock(); // idempotent
    await gate.promise;
    log.push("a1 read back");
  });
  const second = store.withCache(a.id, async (_c, unlock) => {
    log.push("a2 submit");
    await gate.promise;
    unlock(); // after its own wait: the third waits for it
    log.push("a2 read back");
  });
  const third = store.withCache(a.id, () => {
    log.push("a3");
  });
  await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(log, ["a1 submit", "a2 submit"]);
  gate.resolve();
  await Promise.all([first, second, third]);
  assert.deepEqual(log, ["a1 submit", "a2 submit", "a1 read back", "a2 read back", "a3"]);
  // A holder that fails after unlocking does not wedge the mutex either.
  await assert.rejects(
    store.withCache(a.id, (_c, unlock) => {
      unlock();
      return Promise.reject(new Error("y"));
    }),
    /y/,
  );
  assert.equal(await store.withCache(a.id, () => 8), 8);
});

Deno.test("cache store: delete waits for in-flight work and refuses new work", async () => {
  const store = new CacheStore(1 << 20);
  const be = fakeBackend();
  const a = await store.create(be, spec(1), ctx);
  const gate = deferred();
  let workDone = false;
  const work = store.withCache(a.id, async (c) => {
    await gate.promise;
    assert.equal(
      (c.cache as unknown as { destroyed: boolean }).destroyed,
      false,
      "not destroyed under work",
    );
    workDone = true;
  });
  let deleted = false;
  const del = store.delete(a.id).then(() => (deleted = true));
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(deleted, false, "delete waits");
  await assert.rejects(
    store.withCache(a.id, () => {}),
    (e: unknown) => e instanceof ServiceError && e.status === 404,
  );
  assert.deepEqual(store.list(), []);
  gate.resolve();
  await Promise.all([work, del]);
  assert.ok(workDone && deleted);
  assert.equal(store.usedBytes, 0);
});

Deno.test("cache store: a replace queued before a delete finishes, as other queued work does", async () => {
  // Before: the replace, already waiting on the cache's mutex when the delete began, was
  // refused 404 once its turn came (the HTTP audit's PUT .../data behind a forward).
  const store = new CacheStore(1 << 20);
  const be = fakeBackend();
  const a = await store.create(be, spec(2), ctx);
  const gate = deferred();
  const work = store.withCache(a.id, () => gate.promise);
  const order: string[] = [];
  const replaced = store.replace(a.id, async (s) => {
    order.push("replace");
    return await be.createCache(s.cache.spec, ctx);
  });
  const del = store.delete(a.id).then(() => order.push("delete"));
  gate.resolve();
  const r = await replaced;
  await Promise.all([work, del]);
  assert.deepEqual(order, ["replace", "delete"]);
  assert.equal((r.cache as unknown as { destroyed: boolean }).destroyed, true, "deleted after");
  assert.equal(store.usedBytes, 0);
  // A replace asked for once the delete began is refused at once.
  await assert.rejects(
    store.replace(a.id, (s) => s.cache),
    (e: unknown) => e instanceof ServiceError && e.status === 404,
  );
});
