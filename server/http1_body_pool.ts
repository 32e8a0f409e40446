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

/**
 * Drops idle buffers, largest classes first, until `room` more bytes fit under
 * {@link POOL_BYTES}; false when they cannot (`room` over the pool's bytes).
 */
function makeRoom(room: number): boolean {
  if (room > POOL_BYTES) return false;
  if (freeBytes + room <= POOL_BYTES) return true; // fits: nothing to drop (every return)
  const classes = [...free.keys()].sort((a, b) => b - a);
  for (const c of classes) {
    const list = free.get(c)!;
    while (freeBytes + room > POOL_BYTES && list.length > 0) {
      list.pop();
      freeBytes -= c;
    }
    if (list.length === 0) free.delete(c);
    if (freeBytes + room <= POOL_BYTES) break;
  }
  return true;
}

/**
 * Gives a buffer from {@link takeBodyBuffer} back. When the idle buffers would go over
 * {@link POOL_BYTES}, the largest idle ones are dropped to make room: the pool keeps serving the
 * sizes now in use (a server that took a few large prefill bodies once kept refusing every
 * 512 KiB decode body after them, each call allocating a fresh one).
 */
export function giveBodyBuffer(b: ArrayBuffer): void {
  const c = b.byteLength;
  if (!pooled.has(b) || b.detached || !makeRoom(c)) return;
  let list = free.get(c);
  if (!list) free.set(c, list = []);
  list.push(b);
  freeBytes += c;
}

/** Drops every idle buffer (tests). */
export function clearBodyPool(): void {
  free.clear();
  freeBytes = 0;
}

/** Idle bytes kept (tests). */
export function pooledBodyBytes(): number {
  return freeBytes;
}
