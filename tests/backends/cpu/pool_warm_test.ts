/**
 * The CPU_REFERENCE pool's warm workers (backends/cpu/pool.ts `keepWarm`, the backend's and the
 * service's `prewarm`): what a device thread asks so that its first CPU call, and the first after
 * an idle-out, does not wait about 1 s for a worker started from inside a worker. Each call's
 * answer is checked against the oracle on the calling thread.
 * @module
 */
import assert from "node:assert/strict";
import { cpuReference } from "../../../backends/cpu/cpu_reference.ts";
import { CpuWorkerPool, DEVICE_THREAD_WARM_WORKERS } from "../../../backends/cpu/pool.ts";
import { HostKvCache } from "../../../backends/cpu/host_cache.ts";
import { attend, writeKv } from "../../../backends/cpu/reference.ts";
import { type BatchSpec, deriveSeed, generateBatch } from "../../support/batches.ts";
import { AttentionService } from "../../../service/service.ts";
import { ServiceError } from "../../../core/errors.ts";
import { faultyWorkerUrl } from "./faulty_worker.ts";
import { FakeNoDevice } from "../../server/helpers.ts";

const SEED = Number(Deno.env.get("SEED") ?? Math.floor(Math.random() * 2 ** 31));
console.log(`pool_warm seed ${SEED} (rerun: SEED=${SEED})`);

const SPEC: BatchSpec = {
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 16,
  head_size: 16,
  num_heads: 2,
  num_kv_heads: 1,
  requests: [{ query_len: 2, seq_len: 20 }],
  return_lse: false,
};

/** Runs one fresh call on `pool` and checks its output against the in-thread oracle. */
async function checkedCall(pool: CpuWorkerPool, label: string): Promise<void> {
  const g = generateBatch(SPEC, deriveSeed(SEED, label));
  const mk = () => HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
  const mine = mk(), theirs = mk();
  const r = await pool.run({ ...g.batch, cache: mine }, mine);
  const want = { ...g.batch, cache: theirs };
  writeKv(want, theirs);
  assert.deepEqual(r.output, attend(want, theirs).output, label);
}

/** Waits until `pool` has `n` workers, or fails after 5 s. */
async function workersBecome(pool: CpuWorkerPool, n: number, what: string): Promise<void> {
  const t0 = performance.now();
  while (pool.workers !== n) {
    assert.ok(performance.now() - t0 < 5000, `${what}: ${pool.workers} workers, not ${n}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

Deno.test("keepWarm: starts a worker with no call, and the idle-out leaves it", async () => {
  const pool = new CpuWorkerPool({ size: 2, idleMs: 40 });
  try {
    assert.equal(pool.workers, 0, "lazy by default");
    pool.keepWarm(1);
    assert.equal(pool.workers, 1, "started at once, no call waiting");
    pool.keepWarm(1);
    assert.equal(pool.workers, 1, "asking again starts no second one");
    await Promise.all([checkedCall(pool, "a"), checkedCall(pool, "b")]);
    assert.equal(pool.workers, 2);
    await workersBecome(pool, 1, "after the idle-out");
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(pool.workers, 1, "the warm one stays");
    await checkedCall(pool, "c");
    pool.keepWarm(0);
    await checkedCall(pool, "d");
    await workersBecome(pool, 0, "warm 0: every idle worker goes");
    for (const bad of [-1, 0.5, NaN]) assert.throws(() => pool.keepWarm(bad), RangeError);
  } finally {
    await pool.close();
  }
  assert.equal(pool.workers, 0, "close() ends the warm worker too");
});

Deno.test("keepWarm: capped at the pool's size; close() ends it", async () => {
  const pool = new CpuWorkerPool({ size: 1, idleMs: 40 });
  try {
    pool.keepWarm(4);
    assert.equal(pool.workers, 1);
    await pool.close();
    assert.equal(pool.workers, 0);
    await checkedCall(pool, "after close");
    await workersBecome(pool, 0, "after close the pool idles out again");
  } finally {
    await pool.close();
  }
});

Deno.test("keepWarm: a warm worker that crashes is replaced; one that cannot load is not retried", async () => {
  const url = faultyWorkerUrl("crash");
  const pool = new CpuWorkerPool({ size: 1, idleMs: 40, workerUrl: url });
  try {
    pool.keepWarm(1);
    const g = generateBatch(SPEC, deriveSeed(SEED, "crash")); // return_lse false: it crashes
    const cache = HostKvCache.fromBytes(g.cache_spec!, g.key_cache, g.value_cache);
    await assert.rejects(
      pool.run({ ...g.batch, cache }, cache),
      (e) => e instanceof ServiceError && e.code === "cpu_worker_crashed",
    );
    await workersBecome(pool, 1, "the crashed warm worker replaced");
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(pool.workers, 1, "and kept");
  } finally {
    await pool.close();
    URL.revokeObjectURL(url.href);
  }
  const broken = new CpuWorkerPool({
    size: 1,
    workerUrl: new URL("./no_such_worker.ts", import.meta.url),
  });
  try {
    broken.keepWarm(1);
    await workersBecome(broken, 0, "a worker that cannot load ends");
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(broken.workers, 0, "and is not started again and again");
  } finally {
    await broken.close();
  }
});

Deno.test("service.prewarm: CPU_REFERENCE starts its device-thread workers", async () => {
  const backend = cpuReference(new CpuWorkerPool({ size: 2, idleMs: 40 }));
  const service = new AttentionService({
    backends: [backend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    assert.equal(backend.pool.workers, 0);
    service.prewarm();
    assert.equal(backend.pool.workers, DEVICE_THREAD_WARM_WORKERS);
    await checkedCall(backend.pool, "prewarmed");
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(backend.pool.workers, DEVICE_THREAD_WARM_WORKERS);
  } finally {
    await service.close();
  }
  assert.equal(backend.pool.workers, 0);
});
