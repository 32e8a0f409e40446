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

Deno.test("host pool: in-use bytes follow leases; the free cap trims largest first", () => {
  const pool = new HostPool(100 * 1024);
  const a = pool.acquire(5000), b = pool.acquire(40_000), c = pool.acquire(40_000);
  assert.equal(pool.stats().in_use_bytes, 8192 + 65536 * 2);
  a.release();
  b.release();
  assert.deepEqual([pool.stats().in_use_bytes, pool.stats().free_bytes], [65536, 8192 + 65536]);
  // Over the cap (136 KiB free): a 64 KiB buffer goes first, and that is enough.
  c.release();
  assert.deepEqual([pool.stats().in_use_bytes, pool.stats().free_bytes], [0, 8192 + 65536]);
  assert.equal(pool.stats().free, 2);
  // Two 64 KiB leases and the 8 KiB one back: the second 64 KiB one is dropped, not the 8 KiB.
  const d = pool.acquire(65536), e = pool.acquire(65536), f = pool.acquire(8192);
  assert.equal(pool.stats().free_bytes, 0);
  for (const l of [d, e, f]) l.release();
  assert.deepEqual([pool.stats().free_bytes, pool.stats().free], [8192 + 65536, 2]);
});

Deno.test("host pool: the process pool's cap is ATTN_HOST_POOL_MAX_FREE_BYTES (default 1 GiB)", async () => {
  const { hostPool, HOST_POOL_CAP_ENV } = await import("../../gpu/host_pool.ts");
  assert.equal(HOST_POOL_CAP_ENV, "ATTN_HOST_POOL_MAX_FREE_BYTES");
  const set = Deno.env.get(HOST_POOL_CAP_ENV);
  assert.equal(hostPool.maxFreeBytes, set ? Number(set) : 2 ** 30);
  // A fresh module instance (another thread's) reads the variable: checked in a child process.
  const code = `import { hostPool } from ${
    JSON.stringify(import.meta.resolve("../../gpu/host_pool.ts"))
  };
    console.log(hostPool.maxFreeBytes);`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--quiet", code],
    env: { [HOST_POOL_CAP_ENV]: "12345" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(
    new TextDecoder().decode(out.stdout).trim(),
    "12345",
    new TextDecoder().decode(out.stderr),
  );
});
