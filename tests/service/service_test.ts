/** AttentionService: concurrency (no global lock), rejected calls change nothing, lost caches, inline caches. */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { AttentionService } from "../../service/service.ts";
import { FakeNoDevice } from "../server/helpers.ts";
import {
  ANY_CAPS,
  decodeInput,
  deferred,
  f32Tensor,
  type FakeBackend,
  fakeBackend,
  intTensor,
} from "./helpers.ts";

const decode = decodeInput, ints = intTensor, f32 = f32Tensor;

function setup(): { svc: AttentionService; be: FakeBackend } {
  const be = fakeBackend();
  const svc = new AttentionService({
    backends: [be as AttentionBackend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  return { svc, be };
}
const CACHE = {
  num_blocks: 4,
  block_size: 4,
  num_kv_heads: 1,
  head_size: 4,
  dtype: "float32" as const,
};

Deno.test("service: forwards on different caches run concurrently, same cache serialises", async () => {
  const { svc, be } = setup();
  const a = await svc.createCache(CACHE), b = await svc.createCache(CACHE);
  assert.equal(a.backend, "FAKE");
  const gate = deferred();
  be.gate = gate.promise;
  let started = 0;
  const twoStarted = deferred();
  be.onRunStart = () => {
    if (++started === 2) twoStarted.resolve();
  };
  const fa = svc.forward(decode(a.id, 4)), fb = svc.forward(decode(b.id, 4));
  await twoStarted.promise; // both runs are in flight at once: no global lock
  assert.equal(be.active, 2);
  const fa2 = svc.forward(decode(a.id, 6)); // same cache as fa: must wait
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(be.runs, 2, "second forward on cache a waits for the first");
  gate.resolve();
  const [ra] = await Promise.all([fa, fb, fa2]);
  assert.equal(be.runs, 3);
  assert.equal(be.maxActive, 2);
  assert.equal(ra.backend, "FAKE");
  assert.equal(ra.result.output.length, 8);
  assert.ok(typeof ra.result.timings?.total === "number");
});

Deno.test("service: a call that submitted hands its cache on before its read-back", async () => {
  const { svc, be } = setup();
  const a = await svc.createCache(CACHE);
  be.submitsEarly = true;
  const gate = deferred();
  be.gate = gate.promise; // every read-back waits here
  const order: number[] = [];
  const slots = [4, 6, 9];
  const calls = slots.map((s) => svc.forward(decode(a.id, s)).then(() => order.push(s)));
  await new Promise((r) => setTimeout(r, 10));
  // All three ran their submit half while the first read-back still waits: before, the second
  // call on a cache waited for the first call's whole run.
  assert.equal(be.runs, 3);
  assert.equal(be.maxActive, 3);
  const cache = be.created[0];
  const per = cache.bytes / 2 / (CACHE.num_blocks * CACHE.block_size);
  for (const s of slots) assert.equal(cache.key[s * per], 1, `slot ${s} written once`);
  gate.resolve();
  await Promise.all(calls);
  assert.deepEqual(order, slots);
});

Deno.test("service: a rejected call reaches no backend and changes no cache", async () => {
  const { svc, be } = setup();
  const a = await svc.createCache(CACHE);
  await svc.forward(decode(a.id, 5));
  const before = await svc.cacheData(a.id);
  const plans = be.plans, runs = be.runs;
  const bad = decode(a.id, 5);
  bad.metadata.block_table = ints([4], [1, 1]); // block 4 of 4: out of range
  await assert.rejects(
    svc.forward(bad),
    (e: unknown) => e instanceof ServiceError && e.status === 422,
  );
  const bad2 = decode(a.id, 99);
  await assert.rejects(
    svc.forward(bad2),
    (e: unknown) => e instanceof ServiceError && e.code === "invalid_batch",
  );
  assert.equal(be.plans, plans);
  assert.equal(be.runs, runs);
  const after = await svc.cacheData(a.id);
  assert.deepEqual(after.key, before.key);
  assert.deepEqual(after.value, before.value);
  assert.equal(before.key[5 * 16], 1, "the accepted call did write (so the comparison can fail)");
});

Deno.test("service: an unknown cache is a 404 before validation, however bad the batch", async () => {
  // The held cache's spec is what the batch is checked against: without it there is nothing
  // to check block ids and slots against, and a missing resource is a 404, not a 422.
  const { svc, be } = setup();
  const bad = decode("nope", 999);
  bad.query = f32([3, 2, 4]);
  await assert.rejects(
    svc.forward(bad),
    (e: unknown) =>
      e instanceof ServiceError && e.status === 404 && e.code === "cache_not_found" &&
      e.extra?.cache_id === "nope",
  );
  assert.equal(be.runs, 0);
  // The same batch on a cache that exists is the 422 listing every problem.
  const c = await svc.createCache(CACHE);
  await assert.rejects(
    svc.forward({ ...bad, kv_cache: c.id }),
    (e: unknown) =>
      e instanceof ServiceError && e.status === 422 && e.code === "invalid_batch" &&
      e.issues!.length >= 2,
  );
});

Deno.test("service: lost caches are reported and refused with 503", async () => {
  const { svc, be } = setup();
  const a = await svc.createCache(CACHE);
  be.created[0].lost = true;
  assert.equal(svc.getCache(a.id).lost, true);
  await assert.rejects(
    svc.forward(decode(a.id)),
    (e: unknown) => e instanceof ServiceError && e.status === 503,
  );
  await assert.rejects(
    svc.cacheData(a.id),
    (e: unknown) => e instanceof ServiceError && e.code === "device_unavailable",
  );
  await svc.deleteCache(a.id);
  assert.equal(svc.caches.usedBytes, 0);
});

Deno.test("service: inline caches are imported with the chosen backend and freed", async () => {
  const { svc, be } = setup();
  const inline = decode("x");
  delete inline.kv_cache;
  inline.key_cache = { dtype: "float32", shape: [4, 4, 1, 4], bytes: new Uint8Array(256) };
  inline.value_cache = { dtype: "float32", shape: [4, 4, 1, 4], bytes: new Uint8Array(256) };
  const r = await svc.forward(inline);
  assert.equal(r.backend, "FAKE");
  assert.equal(be.imported.length, 1);
  assert.equal(be.imported[0].destroyed, true);
  assert.equal(be.imported[0].key[5 * 16], 1, "the backend wrote into the imported bytes");
  assert.equal(svc.caches.usedBytes, 0);
});

Deno.test("service: select and createCache honour a forced backend", async () => {
  const be = fakeBackend(), other = fakeBackend("OTHER");
  (other as { priority: number }).priority = 5;
  const svc = new AttentionService({
    backends: [other as AttentionBackend, be as AttentionBackend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  assert.equal(svc.select({ head_size: 4, dtype: "float32" }).backend, "FAKE", "priority order");
  assert.equal(svc.select({ head_size: 4, dtype: "float32" }, "OTHER").backend, "OTHER");
  assert.equal(svc.select({ head_size: 4, dtype: "float32" }, "auto").backend, "FAKE");
  const c = await svc.createCache({ ...CACHE, backend: "OTHER" });
  assert.equal(c.backend, "OTHER");
  assert.equal(other.created.length, 1);
  assert.throws(
    () => svc.select({ head_size: 4, dtype: "float32" }, "NOPE"),
    (e: unknown) => e instanceof ServiceError && e.status === 404,
  );
});

Deno.test("service: a forced GPU backend with no device is 503; auto falls back", async () => {
  const host = fakeBackend("HOST"), gpu = fakeBackend("GPUISH");
  (gpu as { priority: number }).priority = -1;
  (gpu as { requires: unknown }).requires = { needs_device: true, features: [], limits: {} };
  const svc = new AttentionService({
    backends: [host as AttentionBackend, gpu as AttentionBackend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  const is503 = (e: unknown) =>
    e instanceof ServiceError && e.status === 503 && e.code === "device_unavailable";
  assert.throws(() => svc.select({ head_size: 4, dtype: "float32" }, "GPUISH"), is503);
  await assert.rejects(svc.createCache({ ...CACHE, backend: "GPUISH" }), is503);
  const c = await svc.createCache(CACHE);
  assert.equal(c.backend, "HOST", "auto selection skips the unavailable backend");
  await assert.rejects(svc.forward({ ...decode(c.id), backend: "GPUISH" }), is503);
  assert.equal((await svc.forward(decode(c.id))).backend, "HOST");
});

Deno.test("service: select says why every other backend cannot run the config", () => {
  const caps = (head_sizes: number[]) => ({ ...ANY_CAPS, head_sizes });
  const first = fakeBackend("FIRST"), win = fakeBackend("WIN");
  const later = fakeBackend("LATER"), able = fakeBackend("ABLE");
  const set = (b: FakeBackend, priority: number, heads: number[]) =>
    Object.assign(b, { priority, capabilities: caps(heads) });
  set(first, 0, [8]);
  set(win, 1, [4, 8]);
  set(later, 2, [8]);
  set(able, 3, [4]);
  const svc = new AttentionService({
    backends: [first, win, later, able] as AttentionBackend[],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  const auto = svc.select({ head_size: 4, dtype: "float32" });
  assert.equal(auto.backend, "WIN");
  assert.deepEqual(Object.keys(auto.rejected), ["FIRST"], "passed over before the winner");
  assert.deepEqual(Object.keys(auto.unsupported), ["LATER"], "after it; ABLE could run it");
  assert.match(auto.unsupported.LATER.join(" "), /head_size not supported \(got 4/);
  const forced = svc.select({ head_size: 4, dtype: "float32" }, "ABLE");
  assert.deepEqual(forced.rejected, {});
  assert.deepEqual(Object.keys(forced.unsupported).sort(), ["FIRST", "LATER"]);
});

Deno.test("service: a call whose client left while it waited for its cache does not run", async () => {
  const { svc, be } = setup();
  const a = await svc.createCache(CACHE);
  const gate = deferred();
  be.gate = gate.promise;
  const started = deferred();
  be.onRunStart = () => started.resolve();
  const first = svc.forward(decode(a.id, 4));
  await started.promise;
  const ac = new AbortController();
  const queued = svc.forward(decode(a.id, 6), { signal: ac.signal });
  await new Promise((r) => setTimeout(r, 10));
  ac.abort(); // the client goes away while its call waits behind the first
  gate.resolve();
  await first;
  await assert.rejects(
    queued,
    (e) => e instanceof ServiceError && e.status === 499 && e.code === "client_closed_request",
  );
  assert.equal(be.runs, 1, "the left call reached no backend");
  const key = be.created[0].key;
  assert.equal(key.reduce((n, x) => n + x, 0), 1, "only the first call wrote");
});
