/**
 * backends/cpu/pool.ts (CPU_REFERENCE off the event loop): pool sizing; concurrent calls on
 * different caches equal sequential ones and the in-thread oracle byte for byte; cancellation
 * while queued, before the write, during it and after it (the cache is never left changed);
 * errors crossing the worker boundary as the same ServiceError; a worker failing or dying
 * part-way through a write (cache restored, worker replaced, no hang); close() and idle
 * teardown. Fresh random data per run (SEED=… to rerun one).
 */
import assert from "node:assert/strict";
import { validHostBatch } from "../../../service/host_input.ts";
import { cpuReference } from "../../../backends/cpu/cpu_reference.ts";
import { CpuWorkerPool, defaultPoolSize } from "../../../backends/cpu/pool.ts";
import { ServiceError } from "../../../core/errors.ts";
import { HostKvCache } from "../../../backends/cpu/host_cache.ts";
import { attend, checkBatch, kvFromCall, writeKv } from "../../../backends/cpu/reference.ts";
import type { ForwardBatch } from "../../../core/types.ts";
import { type BatchSpec, deriveSeed, generateBatch } from "../../support/batches.ts";
import { type Fault, faultyWorkerUrl, SLOW_WRITE_MS } from "./faulty_worker.ts";

const SEED = Number(Deno.env.get("SEED") ?? Math.floor(Math.random() * 2 ** 31));
console.log(`cpu_pool seed ${SEED} (rerun: SEED=${SEED})`);

const BASE: BatchSpec = {
  dtype: "float32",
  kv_cache_dtype: "auto",
  layout: "NHD",
  block_size: 16,
  head_size: 32,
  num_heads: 4,
  num_kv_heads: 2,
  requests: [{ query_len: 3, seq_len: 40 }, { query_len: 1, seq_len: 17, pad: 1 }],
  return_lse: true,
};

/** A decode over a long context: a few hundred ms of CPU_REFERENCE on the CPU machine. */
const LONG: BatchSpec = {
  ...BASE,
  head_size: 64,
  num_heads: 16,
  num_kv_heads: 1,
  requests: [{ query_len: 1, seq_len: 32768 }],
};

interface Call {
  batch: ForwardBatch;
  cache: HostKvCache | null;
}

/** A call on a fresh cache holding the generated initial bytes. */
function call(spec: BatchSpec, label: string): Call {
  const g = generateBatch(spec, deriveSeed(SEED, label));
  const cache = g.cache_spec
    ? HostKvCache.fromBytes(g.cache_spec, g.key_cache, g.value_cache)
    : null;
  return { batch: { ...g.batch, cache }, cache };
}

/** The same call on its own copy of the cache (as it is now). */
function copy(c: Call): Call {
  const cache = c.cache ? HostKvCache.fromBytes(c.cache.spec, c.cache.key, c.cache.value) : null;
  return { batch: { ...c.batch, cache }, cache };
}

function bytesOf(c: Call): Uint8Array[] {
  return c.cache ? [c.cache.key.slice(), c.cache.value.slice()] : [];
}

const raw = (a: Float32Array | null) => a && new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** What the oracle gives on the calling thread (the pre-pool path): output, lse, cache bytes. */
function inThread(c: Call) {
  if (c.cache && !kvFromCall(c.batch)) writeKv(c.batch, c.cache);
  const r = attend(c.batch, kvFromCall(c.batch) ? null : c.cache);
  return { output: raw(r.output), lse: c.batch.return_lse ? raw(r.lse) : null, cache: bytesOf(c) };
}

function runOn(pool: CpuWorkerPool, c: Call, signal?: AbortSignal) {
  return pool.run(c.batch, kvFromCall(c.batch) ? null : c.cache, signal);
}

/** Asserts a ServiceError with this status and code. */
async function rejectsWith(
  p: Promise<unknown>,
  status: number,
  code: string,
): Promise<ServiceError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof ServiceError, `expected a ServiceError, got ${e}`);
    assert.equal(e.status, status, e.message);
    assert.equal(e.code, code, e.message);
    return e;
  }
  assert.fail(`expected ${status} ${code}, the call succeeded`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resolves once `cache` no longer holds `before` (polls; the worker writes in place). */
async function changed(cache: HostKvCache, before: Uint8Array[]): Promise<void> {
  const t0 = performance.now();
  while (cache.key.every((b, i) => b === before[0][i])) {
    assert.ok(performance.now() - t0 < 10_000, "the worker never wrote");
    await sleep(2);
  }
}

async function withFaulty<T>(fault: Fault, fn: (pool: CpuWorkerPool) => Promise<T>): Promise<T> {
  const url = faultyWorkerUrl(fault);
  const pool = new CpuWorkerPool({ size: 1, workerUrl: url });
  try {
    return await fn(pool);
  } finally {
    await pool.close();
    URL.revokeObjectURL(url.href);
  }
}

Deno.test("pool size: cores - 1, at least 1, at most 8; bad sizes refused", () => {
  assert.deepEqual([1, 2, 3, 4, 9, 10, 128].map((n) => defaultPoolSize(n)), [1, 1, 2, 3, 8, 8, 8]);
  assert.equal(defaultPoolSize(0), 1);
  assert.equal(new CpuWorkerPool().size, defaultPoolSize(navigator.hardwareConcurrency));
  assert.equal(new CpuWorkerPool().workers, 0, "workers start lazily");
  for (const size of [0, 1.5, -1]) assert.throws(() => new CpuWorkerPool({ size }), RangeError);
});

Deno.test("concurrent calls on different caches equal sequential ones and the in-thread oracle, byte for byte", async () => {
  const specs: [string, BatchSpec][] = [
    ["f32 NHD", BASE],
    ["bf16 on fp8 HND, sinks", {
      ...BASE,
      dtype: "bfloat16",
      kv_cache_dtype: "fp8_e4m3",
      layout: "HND",
      k_scale: 0.5,
      v_scale: 2,
      sinks: true,
    }],
    ["f16, alibi, window, cap", {
      ...BASE,
      dtype: "float16",
      alibi: true,
      sliding_window: 9,
      logits_soft_cap: 20,
    }],
    ["encoder", {
      ...BASE,
      attn_type: "encoder",
      requests: [{ query_len: 5, seq_len: 5 }, { query_len: 2, seq_len: 2 }],
    }],
    ["encoder_decoder", {
      ...BASE,
      attn_type: "encoder_decoder",
      requests: [{ query_len: 2, seq_len: 7 }, { query_len: 1, seq_len: 4 }],
    }],
  ];
  const calls = specs.map(([label, spec]) => call(spec, label));
  const want = calls.map((c) => inThread(copy(c)));
  const pool = new CpuWorkerPool({ size: 3 });
  try {
    const sequential: ReturnType<typeof inThread>[] = [];
    for (const c of calls.map(copy)) {
      const r = await runOn(pool, c);
      sequential.push({ output: raw(r.output), lse: raw(r.lse), cache: bytesOf(c) });
    }
    // Three long calls at once: the pool grows to three workers (one start per task).
    const long = call(LONG, "grow");
    await Promise.all([0, 1, 2].map(() => runOn(pool, copy(long))));
    assert.equal(pool.workers, 3);
    const mine = calls.map(copy);
    const pending = Promise.all(mine.map((c) => runOn(pool, c)));
    pending.catch(() => {}); // an assertion below may fail first
    assert.equal(pool.busy, 3, "three calls run at once, on three workers");
    assert.equal(pool.queued, 2, "the other two wait");
    const concurrent = (await pending).map((r, i) => ({
      output: raw(r.output),
      lse: raw(r.lse),
      cache: bytesOf(mine[i]),
    }));
    specs.forEach(([label], i) => {
      assert.deepEqual(sequential[i], want[i], `${label}: sequential vs in-thread`);
      assert.deepEqual(concurrent[i], want[i], `${label}: concurrent vs in-thread`);
    });
    assert.equal(pool.workers, 3);
  } finally {
    await pool.close();
  }
});

Deno.test("a burst on a cold pool starts one worker per task; every call still runs", async () => {
  const pool = new CpuWorkerPool({ size: 3 });
  try {
    const calls = [0, 1, 2, 3].map((i) => call(BASE, `burst-${i}`));
    const want = calls.map((c) => inThread(copy(c)));
    const pending = Promise.all(calls.map((c) => runOn(pool, c)));
    pending.catch(() => {}); // an assertion below may fail first
    assert.equal(pool.workers, 1, "one worker started in this task (new Worker blocks the loop)");
    assert.equal(pool.queued, 3);
    const got = await pending;
    got.forEach((r, i) => assert.deepEqual(raw(r.output), want[i].output, `call ${i}`));
    assert.ok(pool.workers >= 1 && pool.workers <= 3);
  } finally {
    await pool.close();
  }
});

Deno.test("cancellation: a queued call and an already aborted call write nothing (499)", async () => {
  const pool = new CpuWorkerPool({ size: 1 });
  try {
    const long = call(LONG, "long");
    const small = call(BASE, "small");
    const before = bytesOf(small);
    const running = runOn(pool, long);
    const ac = new AbortController();
    const queued = runOn(pool, small, ac.signal);
    assert.equal(pool.queued, 1);
    ac.abort();
    const e = await rejectsWith(queued, 499, "client_closed_request");
    assert.deepEqual(e.extra, { cache_write: "none" });
    assert.equal(pool.queued, 0);
    assert.equal(pool.busy, 1, "the queued call was dropped while the long one still runs");
    await rejectsWith(runOn(pool, small, AbortSignal.abort()), 499, "client_closed_request");
    assert.deepEqual(bytesOf(small), before, "nothing written");
    await running;
    // The pool goes on: the same call now runs and writes what the oracle writes.
    const want = inThread(copy(small));
    const r = await runOn(pool, small);
    assert.deepEqual({ output: raw(r.output), lse: raw(r.lse), cache: bytesOf(small) }, want);
  } finally {
    await pool.close();
  }
});

Deno.test("cancellation after the write: the worker stops at once and the write is undone", async () => {
  const pool = new CpuWorkerPool({ size: 1 });
  try {
    const c = call(LONG, "long-abort");
    const before = bytesOf(c);
    const full = performance.now();
    const first = await runOn(pool, copy(c)); // warms the worker; times a whole call
    const whole = performance.now() - full;
    const ac = new AbortController();
    const p = runOn(pool, c, ac.signal);
    await changed(c.cache!, before);
    await sleep(20);
    const t0 = performance.now();
    ac.abort();
    await rejectsWith(p, 499, "client_closed_request");
    const waited = performance.now() - t0;
    assert.ok(waited < whole / 2, `stopped after ${waited} ms (a whole call takes ${whole} ms)`);
    assert.deepEqual(bytesOf(c), before, "the write was undone");
    assert.equal(pool.workers, 0, "the stopped worker is gone");
    const r = await runOn(pool, c);
    assert.equal(pool.workers, 1, "a fresh worker ran the next call");
    assert.deepEqual(raw(r.output), raw(first.output), "same answer as on the untouched cache");
  } finally {
    await pool.close();
  }
});

Deno.test("cancellation during the write: the write completes, then is undone (499)", async () => {
  await withFaulty("slow", async (pool) => {
    const c = call(BASE, "slow-write");
    const before = bytesOf(c);
    const ac = new AbortController();
    const t0 = performance.now();
    const p = runOn(pool, c, ac.signal);
    await changed(c.cache!, before); // first row written, the rest pending
    ac.abort();
    await rejectsWith(p, 499, "client_closed_request");
    assert.ok(performance.now() - t0 >= SLOW_WRITE_MS - 20, "waited for the write to finish");
    assert.deepEqual(bytesOf(c), before, "the write was undone");
  });
});

Deno.test("errors: a 422 thrown in the worker arrives as the same ServiceError; nothing written", async () => {
  const pool = new CpuWorkerPool({ size: 1 });
  try {
    const c = call(BASE, "bad-table");
    // plan() would refuse this; run it anyway so the worker's own check throws.
    const table = c.batch.metadata.block_table.slice();
    table[0] = 999;
    const bad = { ...c.batch, metadata: { ...c.batch.metadata, block_table: table } };
    let want: unknown;
    try {
      checkBatch(bad, c.cache);
    } catch (e) {
      want = e;
    }
    assert.ok(want instanceof ServiceError);
    const before = bytesOf(c);
    const got = await rejectsWith(pool.run(bad, c.cache), 422, "invalid_batch");
    assert.equal(got.name, want.name);
    assert.equal(got.message, want.message);
    assert.equal(got.title, want.title);
    assert.deepEqual(got.issues, want.issues);
    assert.deepEqual(got.issues?.[0].path, ["metadata", "block_table", 0, 0]);
    assert.deepEqual(bytesOf(c), before);
    // A destroyed cache is refused before anything is posted.
    c.cache!.destroy();
    await rejectsWith(runOn(pool, c), 409, "cache_destroyed");
  } finally {
    await pool.close();
  }
});

Deno.test("errors: a worker throwing mid-write: 500 cpu_worker_failed, cache restored, worker kept", async () => {
  await withFaulty("throw", async (pool) => {
    const c = call(BASE, "throw");
    const before = bytesOf(c);
    const e = await rejectsWith(runOn(pool, c), 500, "cpu_worker_failed");
    assert.match(e.message, /TypeError: injected fault after the first row/);
    assert.deepEqual(bytesOf(c), before, "the first row was put back");
    assert.equal(pool.workers, 1, "a caught error does not cost the worker");
  });
});

Deno.test("crash: a worker dying mid-write fails its call (500), restores the cache, is replaced", async () => {
  await withFaulty("crash", async (pool) => {
    const ok = call(BASE, "before-crash");
    await runOn(pool, ok);
    const c = call({ ...BASE, return_lse: false }, "crash");
    const before = bytesOf(c);
    const e = await rejectsWith(runOn(pool, c), 500, "cpu_worker_crashed");
    assert.match(e.message, /injected crash after the first row/);
    assert.deepEqual(e.extra, { cache_write: "none" });
    assert.deepEqual(bytesOf(c), before, "the first row was put back");
    assert.equal(pool.workers, 0, "the dead worker is gone");
    const next = call(BASE, "after-crash");
    const want = inThread(copy(next));
    const r = await runOn(pool, next);
    assert.deepEqual(raw(r.output), want.output, "a fresh worker serves the next call");
    assert.equal(pool.workers, 1);
  });
});

Deno.test("crash: a worker module that cannot load fails each call with 500, never hangs", async () => {
  const pool = new CpuWorkerPool({
    size: 1,
    workerUrl: new URL("./no_such_worker.ts", import.meta.url),
  });
  try {
    const c = call(BASE, "no-module");
    const before = bytesOf(c);
    for (let i = 0; i < 2; i++) {
      const e = await rejectsWith(runOn(pool, c), 500, "cpu_worker_crashed");
      assert.match(e.message, /^the CPU_REFERENCE worker running this call crashed \(/);
      assert.equal(pool.workers, 0);
    }
    assert.deepEqual(bytesOf(c), before);
  } finally {
    await pool.close();
  }
});

Deno.test("close(): waits for running calls, refuses queued and new ones (503), terminates workers", async () => {
  const pool = new CpuWorkerPool({ size: 1 });
  const long = call(LONG, "close-long");
  const queued = call(BASE, "close-queued");
  const before = bytesOf(queued);
  const running = runOn(pool, long);
  const waiting = runOn(pool, queued);
  const closed = pool.close();
  await rejectsWith(waiting, 503, "cpu_pool_closed");
  await rejectsWith(runOn(pool, queued), 503, "cpu_pool_closed");
  const r = await running;
  assert.equal(r.output.length, 16 * 64, "the running call completed");
  await closed;
  assert.equal(pool.workers, 0);
  assert.deepEqual(bytesOf(queued), before);
  // Usable again afterwards: a new worker starts on demand.
  await runOn(pool, queued);
  assert.equal(pool.workers, 1);
  await pool.close();
  assert.equal(pool.workers, 0);
});

Deno.test("idle workers are terminated after idleMs", async () => {
  const pool = new CpuWorkerPool({ size: 2, idleMs: 50 });
  try {
    await Promise.all([runOn(pool, call(BASE, "idle-a")), runOn(pool, call(BASE, "idle-b"))]);
    assert.equal(pool.workers, 2);
    const t0 = performance.now();
    while (pool.workers > 0) {
      assert.ok(performance.now() - t0 < 5000, "idle workers were never terminated");
      await sleep(20);
    }
  } finally {
    await pool.close();
  }
});

Deno.test("CPU_REFERENCE.run takes a signal; close() ends its workers", async () => {
  const backend = cpuReference(new CpuWorkerPool({ size: 1 }));
  const ctx = { gpu: null };
  try {
    const c = call(BASE, "backend");
    const before = bytesOf(c);
    const batch = validHostBatch(c.batch, c.batch.cache);
    const plan = await backend.plan(batch, ctx);
    await rejectsWith(
      backend.run(plan, batch, ctx, { signal: AbortSignal.abort() }),
      499,
      "client_closed_request",
    );
    assert.deepEqual(bytesOf(c), before);
    const r = await backend.run(plan, batch, ctx);
    assert.equal(backend.pool.workers, 1);
    assert.deepEqual(Object.keys(r.timings!).sort(), ["attend", "queue", "write"]);
  } finally {
    await backend.close();
  }
  assert.equal(backend.pool.workers, 0);
});
