/**
 * Request body buffers kept for reuse by the service's own HTTP/1.1 server (http1_server.ts), for
 * bodies whose reader says they are borrowed (body_read.ts `readBody`'s `borrow`: a forward's
 * safetensors body, read by the route and given up once its answer is built). A fresh buffer per
 * call costs its allocation, zeroing and page faults: on the 2-core dev VM a 412 KB body allocated
 * per call held a Deno.listen server at ~0.37 ms of CPU a call against ~0.11 ms reused (bench/NOTES.md
 * v0.28). Buffers come in power-of-two sizes from 64 KiB to 16 MiB, at most {@link POOL_BYTES} kept.
 * @module
 */

/** The largest body a pooled buffer holds. */
export const POOLED_BODY_MAX = 16 * 1024 * 1024;

/** Bytes of idle buffers kept, at most. */
export const POOL_BYTES = 64 * 1024 * 1024;

const MIN_CLASS = 64 * 1024;

const free = new Map<number, ArrayBuffer[]>();
let freeBytes = 0;
const pooled = new WeakSet<ArrayBuffer>();

/** Whether `b` is one of this pool's buffers (not to be detached: it goes back here). */
export function isPooledBodyBuffer(b: ArrayBufferLike): boolean {
  return b instanceof ArrayBuffer && pooled.has(b);
}

function classOf(n: number): number {
  let c = MIN_CLASS;
  while (c < n) c *= 2;
  return c;
}

/** A buffer of at least `n` bytes (`n` <= {@link POOLED_BODY_MAX}), from the pool or new. */
export function takeBodyBuffer(n: number): ArrayBuffer {
  const c = classOf(n);
  const list = free.get(c);
  const b = list?.pop();
  if (b) {
    freeBytes -= c;
    return b;
  }
  const made = new ArrayBuffer(c);
  pooled.add(made);
  return made;
}

/** Gives a buffer from {@link takeBodyBuffer} back (dropped when the pool is full). */
export function giveBodyBuffer(b: ArrayBuffer): void {
  const c = b.byteLength;
  if (!pooled.has(b) || b.detached || freeBytes + c > POOL_BYTES) return;
  let list = free.get(c);
  if (!list) free.set(c, list = []);
  list.push(b);
  freeBytes += c;
}

/** Idle bytes kept (tests). */
export function pooledBodyBytes(): number {
  return freeBytes;
}
