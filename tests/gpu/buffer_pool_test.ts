/**
 * The GPU buffer pool (gpu/buffer_pool.ts) over a stand-in device, no GPU needed: size classes,
 * reuse, in-use bytes, the free-bytes cap (largest classes destroyed first), a lost device's
 * pool (destroys what comes back, leaves the totals /metrics shows), and the cap's environment
 * variable.
 */
import assert from "node:assert/strict";
import type { GpuContext } from "../../core/types.ts";
import { EnvValueError } from "../../core/env.ts";
import {
  BufferPool,
  bufferPoolTotals,
  DEFAULT_POOL_MAX_FREE_BYTES,
  poolCapFromEnv,
  poolOf,
} from "../../gpu/buffer_pool.ts";
import { withEnv } from "../support/env.ts";

interface FakeBuffer {
  label: string;
  size: number;
  usage: number;
  destroyed: boolean;
  destroy(): void;
}

/** A device that hands out plain objects and counts what it created. */
function fakeDevice(lost?: Promise<unknown>) {
  const made: FakeBuffer[] = [];
  const device = {
    lost,
    createBuffer({ label, size, usage }: { label: string; size: number; usage: number }) {
      const b: FakeBuffer = {
        label,
        size,
        usage,
        destroyed: false,
        destroy() {
          b.destroyed = true;
        },
      };
      made.push(b);
      return b;
    },
    createQuerySet() {
      return { destroy() {} };
    },
  };
  return { device: device as unknown as GPUDevice, made };
}

const KiB = 1024;
const STORAGE = 0x80, COPY = 0x4;
const asGpu = (b: FakeBuffer) => b as unknown as GPUBuffer;

Deno.test("buffer pool: classes, reuse by usage and class, in-use bytes", () => {
  const { device, made } = fakeDevice();
  const pool = new BufferPool(device);
  const a = pool.acquire(1000, STORAGE); // class 1 KiB
  const b = pool.acquire(100, STORAGE); // class 256 B
  assert.deepEqual(made.map((x) => x.size), [1024, 256]);
  assert.deepEqual([pool.stats().in_use, pool.stats().in_use_bytes], [2, 1280]);
  pool.release(a, b);
  assert.deepEqual(
    [pool.stats().in_use, pool.stats().in_use_bytes, pool.stats().free_bytes],
    [0, 0, 1280],
  );
  assert.equal(pool.acquire(600, STORAGE), a, "the 1 KiB class again");
  assert.notEqual(pool.acquire(100, COPY), b, "another usage is another list");
  const s = pool.stats();
  assert.deepEqual([s.created, s.reused, s.in_use_bytes, s.free_bytes], [3, 1, 1280, 256]);
  pool.release(asGpu({ ...made[0] })); // a buffer the pool never lent: ignored
  assert.equal(pool.stats().in_use, 2);
});

Deno.test("buffer pool: a preferred buffer is lent where it is free, else the last returned", () => {
  const { device, made } = fakeDevice();
  const pool = new BufferPool(device);
  const [a, b, c] = [1, 2, 3].map(() => pool.acquire(1000, STORAGE));
  pool.release(a, b, c); // back in reverse: a is the last returned
  assert.equal(pool.acquire(1000, STORAGE, "x", b), b, "the preferred one, though not last");
  assert.equal(pool.acquire(1000, STORAGE, "x", b), a, "b is lent: the last returned");
  const other = pool.acquire(1000, COPY, "x", c);
  assert.notEqual(other, c, "a preferred buffer of another usage is not lent");
  assert.equal(made.length, 4);
  assert.equal(pool.acquire(1000, STORAGE, "x", c), c, "c was still free");
  assert.equal(pool.stats().free_bytes, 0);
});

Deno.test("buffer pool: free bytes over the cap are destroyed, largest classes first", () => {
  const { device, made } = fakeDevice();
  const pool = new BufferPool(device, 64 * KiB);
  const big = [pool.acquire(32 * KiB, STORAGE), pool.acquire(32 * KiB, STORAGE)];
  const mid = [pool.acquire(16 * KiB, STORAGE), pool.acquire(16 * KiB, STORAGE)];
  const small = [pool.acquire(4 * KiB, STORAGE), pool.acquire(4 * KiB, STORAGE)];
  pool.release(...small, ...mid); // 40 KiB: under the cap, all kept
  assert.equal(pool.stats().free_bytes, 40 * KiB);
  assert.ok(made.every((b) => !b.destroyed));
  pool.release(...big); // 104 KiB: the 32 KiB class goes first, down to 40 KiB
  const s = pool.stats();
  assert.equal(s.free_bytes, 40 * KiB);
  assert.deepEqual(
    made.filter((b) => b.destroyed).map((b) => b.size),
    [32 * KiB, 32 * KiB],
    "only the largest class destroyed",
  );
  assert.equal(s.free, 4);
  // A tighter cap: past 64 KiB the 16 KiB class goes, then 4 KiB ones only as needed.
  const more = [16, 16, 16].map((k) => pool.acquire(k * KiB, STORAGE)); // two reused, one new
  assert.equal(pool.stats().free_bytes, 8 * KiB);
  pool.release(...more, pool.acquire(60 * KiB, STORAGE)); // + 48 + 64 KiB = 120 KiB free
  const t = pool.stats();
  assert.ok(t.free_bytes <= 64 * KiB, `${t.free_bytes}`);
  assert.equal(t.free_bytes, 56 * KiB, "the 64 KiB buffer went, then one 16 KiB one");
  assert.equal(t.in_use_bytes, 0);
  // A cap of 0 keeps nothing.
  const none = new BufferPool(device, 0);
  const x = none.acquire(10, STORAGE);
  none.release(x);
  assert.equal(none.stats().free_bytes, 0);
  assert.equal((x as unknown as FakeBuffer).destroyed, true);
});

Deno.test("buffer pool: a lost device's pool keeps nothing and leaves the totals", async () => {
  let lose!: (v: unknown) => void;
  const { device, made } = fakeDevice(new Promise((r) => lose = r));
  const ctx = { device, generation: 1, lost: false } as unknown as GpuContext;
  const before = bufferPoolTotals();
  const pool = poolOf(ctx);
  assert.equal(poolOf(ctx), pool, "one pool a device");
  assert.equal(pool.maxFreeBytes, poolCapFromEnv("ATTN_GPU_POOL_MAX_FREE_BYTES"));
  const a = pool.acquire(1000, STORAGE), b = pool.acquire(300, STORAGE);
  pool.release(b);
  const during = bufferPoolTotals();
  assert.equal(during.pools, before.pools + 1);
  assert.equal(during.in_use_bytes - before.in_use_bytes, 1024);
  assert.equal(during.free_bytes - before.free_bytes, 512);
  assert.equal(during.max_free_bytes - before.max_free_bytes, pool.maxFreeBytes);
  assert.equal(during.created - before.created, 2);
  lose({ reason: "unknown", message: "test" });
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(pool.lost, true);
  assert.equal(made[1].destroyed, true, "the free buffer destroyed");
  pool.release(a); // a call that finished after the loss
  assert.equal(made[0].destroyed, true, "a buffer released after the loss destroyed");
  assert.deepEqual([pool.stats().free_bytes, pool.stats().in_use_bytes], [0, 0]);
  const after = bufferPoolTotals();
  assert.equal(after.pools, before.pools);
  assert.equal(after.free_bytes, before.free_bytes);
  assert.equal(after.in_use_bytes, before.in_use_bytes);
  assert.equal(after.created - before.created, 2, "counters never go back");
});

Deno.test("buffer pool: the cap's environment variable", async () => {
  const name = "ATTN_TEST_POOL_CAP";
  assert.equal(DEFAULT_POOL_MAX_FREE_BYTES, 2 ** 30);
  assert.equal(poolCapFromEnv(name, undefined), DEFAULT_POOL_MAX_FREE_BYTES);
  assert.equal(poolCapFromEnv(name, ""), DEFAULT_POOL_MAX_FREE_BYTES);
  assert.equal(poolCapFromEnv(name, "0"), 0);
  assert.equal(poolCapFromEnv(name, "268435456"), 2 ** 28);
  // Was the default 1 GiB with a warning: now refused, each time, naming the variable.
  for (const bad of ["1GiB", "-1", "1e9", "2.5", " 1", "99999999999999999999"]) {
    assert.throws(
      () => poolCapFromEnv(name, bad),
      (e) =>
        e instanceof EnvValueError && e.variable === name && e.value === bad &&
        e.message === `${name} must be an integer >= 0 (bytes), got ${JSON.stringify(bad)}`,
      bad,
    );
  }
  await withEnv({ [name]: "4096" }, () => assert.equal(poolCapFromEnv(name), 4096));
});
