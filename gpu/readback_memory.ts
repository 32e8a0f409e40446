/**
 * Where a launch's read-back bytes live from the map until the result's `release()`
 * (gpu/launch.ts), one of three ways:
 *
 * - **Deno's runtime**: its `getMappedRange` already copied the range into a V8 buffer
 *   (gpu/map_read.ts `ownsMappedCopies`); that copy is moved out (`transfer`) before `unmap`
 *   detaches it, and freed at release.
 * - **Lent** (Dawn, whose ranges are the mapping itself, when the caller asked for it and
 *   promised to release the result: the HTTP routes, which release once the answer was
 *   delivered): the mapped range itself. The read-back buffer stays mapped and out of the pool
 *   until release, which unmaps it and gives it back; no copy. A 4 x 2048 prefill's 67 MB
 *   answer copied into touched host memory took 11.2 ms on the H200 host (bench/NOTES.md v0.4).
 *   A result dropped without release (a caller that gave up on it) is unmapped and pooled
 *   again once its `release` function is collected ({@link lentReadbackStats} counts those).
 * - **Copied**: into lent host memory (gpu/host_pool.ts), so that the buffer is unmapped and
 *   pooled at once and a library caller that keeps the parts and drops the result reads its
 *   bytes safely.
 * @module
 */
import { hostPool } from "./host_pool.ts";
import { ownsMappedCopies } from "./map_read.ts";
import { countLent, countReturned, lentOut } from "./lent_count.ts";

/** The part of the buffer pool this module uses (gpu/buffer_pool.ts). */
interface Pool {
  release(...buffers: GPUBuffer[]): void;
}

/** A read-back's memory (see the module doc). */
export interface ReadbackMemory {
  /** The bytes, at offset 0. */
  mem: ArrayBuffer;
  /** Frees them (idempotent). */
  release(): void;
  /**
   * The read-back buffer is still mapped and out of the pool, and `release` unmaps it and
   * gives it back: the launch must neither unmap nor pool it.
   */
  lent: boolean;
}

interface LentState {
  done: boolean;
  buffer: GPUBuffer;
  pool: Pool;
}

let lentTotal = 0;
let collected = 0;

function giveBack(s: LentState): void {
  if (s.done) return;
  s.done = true;
  countReturned();
  try {
    s.buffer.unmap();
  } catch {
    // a destroyed buffer (its device lost) is unmapped already
  }
  s.pool.release(s.buffer);
}

// Holds each lent buffer's state (not its release function, whose collection it watches).
const unreleased = new FinalizationRegistry<LentState>((s) => {
  if (s.done) return;
  collected++;
  giveBack(s);
});

/**
 * The memory of a read-back mapped at `range` (`total` bytes used), taken one of the three
 * ways of the module doc: lent where `lend` and the runtime's range is the mapping.
 */
export function readbackMemory(
  device: GPUDevice,
  pool: Pool,
  readback: GPUBuffer,
  range: ArrayBuffer,
  total: number,
  lend: boolean,
): ReadbackMemory {
  if (ownsMappedCopies(device)) {
    const mem = range.transfer();
    return { mem, release: () => void (mem.detached || mem.transfer(0)), lent: false };
  }
  if (lend) {
    const state: LentState = { done: false, buffer: readback, pool };
    countLent();
    lentTotal++;
    const release = () => {
      if (state.done) return;
      unreleased.unregister(state);
      giveBack(state);
    };
    unreleased.register(release, state, state);
    return { mem: range, release, lent: true };
  }
  const lease = hostPool.acquire(total);
  lease.bytes.set(new Uint8Array(range, 0, total));
  return { mem: lease.bytes.buffer, release: lease.release, lent: false };
}

/**
 * Read-backs lent: not yet released, ever, and those given back when their result was
 * collected unreleased.
 */
export function lentReadbackStats(): { out: number; lent: number; collected: number } {
  return { out: lentOut(), lent: lentTotal, collected };
}
