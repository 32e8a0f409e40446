/**
 * The host-memory pool read-backs are lent from (gpu/host_pool.ts): size classes, reuse after
 * release, no memory shared by two live leases, idempotent release, the free-bytes cap, and
 * stats that return to zero in use (no leak).
 */
import assert from "node:assert/strict";
import { HostPool, MIN_HOST_CLASS } from "../../gpu/host_pool.ts";
import { sizeClass } from "../../gpu/buffer_pool.ts";

const hostSizeClass = (n: number) => sizeClass(n, MIN_HOST_CLASS);

Deno.test("host pool: power-of-two classes from 4 KiB", () => {
  assert.equal(hostSizeClass(0), MIN_HOST_CLASS);
  assert.equal(hostSizeClass(4096), 4096);
  assert.equal(hostSizeClass(4097), 8192);
  assert.equal(hostSizeClass(64 * 2 ** 20 + 16), 128 * 2 ** 20);
});

Deno.test("host pool: a released buffer is lent again; live leases never share memory", () => {
  const pool = new HostPool();
  const a = pool.acquire(10_000);
  assert.equal(a.bytes.byteLength, 10_000);
  assert.equal(a.bytes.buffer.byteLength, 16384);
  const b = pool.acquire(10_000);
  assert.notEqual(a.bytes.buffer, b.bytes.buffer, "two live leases got the same memory");
  a.bytes.fill(1);
  b.bytes.fill(2);
  assert.ok(a.bytes.every((x) => x === 1), "writing one lease changed another");
  const first = a.bytes.buffer;
  a.release();
  a.release(); // idempotent: must not put the buffer in the pool twice
  const c = pool.acquire(9000);
  assert.equal(c.bytes.buffer, first, "the released buffer was not reused");
  const d = pool.acquire(9000);
  assert.notEqual(d.bytes.buffer, first, "a buffer released twice was lent twice");
  assert.notEqual(d.bytes.buffer, b.bytes.buffer);
  for (const l of [b, c, d]) l.release();
  const s = pool.stats();
  assert.equal(s.in_use, 0);
  assert.equal(s.created, 3);
  assert.equal(s.reused, 1);
  assert.equal(s.free, 3);
});

Deno.test("host pool: steady state allocates nothing; free bytes stay under the cap", () => {
  const pool = new HostPool(128 * 1024);
  for (let i = 0; i < 50; i++) {
    const ls = [pool.acquire(5000), pool.acquire(40_000), pool.acquire(100)];
    ls.forEach((l) => l.release());
  }
  const s = pool.stats();
  assert.equal(s.created, 3);
  assert.equal(s.reused, 147);
  assert.equal(s.in_use, 0);
  const big = pool.acquire(200_000); // a class over the cap is not kept
  big.release();
  assert.ok(pool.stats().free_bytes <= 128 * 1024, `${pool.stats().free_bytes}`);
});

Deno.test("host pool: a transferred buffer is not taken back", () => {
  const pool = new HostPool();
  const a = pool.acquire(100);
  a.bytes.buffer.transfer();
  a.release();
  assert.equal(pool.stats().free, 0);
  assert.equal(pool.stats().in_use, 0);
});
