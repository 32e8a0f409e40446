/**
 * The HTTP/1.1 server's body buffers (server/http1_body_pool.ts): reused by size class, and a
 * pool full of one size's idle buffers still takes back (and so reuses) another size's.
 * @module
 */
import assert from "node:assert/strict";
import {
  clearBodyPool,
  giveBodyBuffer,
  POOL_BYTES,
  POOLED_BODY_MAX,
  pooledBodyBytes,
  takeBodyBuffer,
} from "../../server/http1_body_pool.ts";

Deno.test("http1 body pool: a buffer given back is the next one taken of its class", () => {
  clearBodyPool();
  const a = takeBodyBuffer(411_684);
  assert.equal(a.byteLength, 512 * 1024);
  giveBodyBuffer(a);
  assert.equal(takeBodyBuffer(400_000), a);
  giveBodyBuffer(a);
});

Deno.test("http1 body pool: full of large idle buffers, it still keeps a small one", () => {
  clearBodyPool();
  const big = Array.from(
    { length: POOL_BYTES / POOLED_BODY_MAX },
    () => takeBodyBuffer(POOLED_BODY_MAX),
  );
  for (const b of big) giveBodyBuffer(b);
  assert.equal(pooledBodyBytes(), POOL_BYTES, "the pool is full of 16 MiB buffers");
  const small = takeBodyBuffer(411_684); // none idle of its class: a new one
  giveBodyBuffer(small);
  assert.ok(pooledBodyBytes() <= POOL_BYTES);
  assert.equal(takeBodyBuffer(411_684), small, "the decode-sized body buffer is reused");
  giveBodyBuffer(small);
  // The large ones that stayed are still served.
  assert.ok(big.includes(takeBodyBuffer(POOLED_BODY_MAX)));
  clearBodyPool();
});
