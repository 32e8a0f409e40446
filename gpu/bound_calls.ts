/**
 * What gpu/plan_bind.ts reuses between calls: a plan's calls as last bound to one set of
 * buffers, with their bind groups ({@link BoundCalls}), kept per call list and cache.
 * @module
 */
import type { KernelCall } from "./launch.ts";
import type { PlannedCall } from "./gpu_plan.ts";

/**
 * Calls a plan's call list was bound to, with their bind groups, and every buffer they bind in a
 * fixed order: a call of the same plan, or of a later plan sharing its list (gpu/plan_builder.ts:
 * a decode step whose decomposition did not change), that gets the same buffers (the pool hands
 * them back in steady state; the layers of an engine step share one plan, each on its cache)
 * reuses them as they are, without resolving a binding or building a bind-group key.
 * The table's bytes are the plan's own; only where they go is shared.
 */
export interface BoundCalls {
  buffers: GPUBuffer[];
  /** The pooled buffers among `buffers`, in the order the binding acquired them. */
  owned: GPUBuffer[];
  /** Where the packed inputs lie in their buffer (offset, bytes pairs), empty when not packed. */
  ranges: number[];
  calls: KernelCall[];
}
/**
 * Bound states kept per call list and cache (a WeakMap: they go with the cache), most recently
 * used first: the layers of an engine step share a plan, each on its own cache, and a few per
 * cache cover the pooled buffers concurrent calls take. (One per call list was bound anew on
 * every call as the layers took turns.)
 */
export const BOUND_VARIANTS = 4;
/** The key of a plan's states on no cache (an encoder call). */
const NO_CACHE = {};
const lastBound = new WeakMap<PlannedCall[], WeakMap<object, BoundCalls[]>>();

/** The states of `calls` on `cache` (created empty). */
export function boundList(calls: PlannedCall[], cache: object | null): BoundCalls[] {
  let byCache = lastBound.get(calls);
  if (!byCache) lastBound.set(calls, byCache = new WeakMap());
  let list = byCache.get(cache ?? NO_CACHE);
  if (!list) byCache.set(cache ?? NO_CACHE, list = []);
  return list;
}

/** The state of `list` over `buffers` and `ranges`, moved to the front; or undefined. */
export function findBound(
  list: BoundCalls[],
  buffers: GPUBuffer[],
  ranges: number[],
): BoundCalls | undefined {
  for (let i = 0; i < list.length; i++) {
    const x = list[i];
    if (!sameList(x.buffers, buffers) || !sameList(x.ranges, ranges)) continue;
    if (i > 0) {
      list.splice(i, 1);
      list.unshift(x);
    }
    return x;
  }
  return undefined;
}

function sameList<T>(a: T[], b: T[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
