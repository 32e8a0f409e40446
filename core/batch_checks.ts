/**
 * Batch checks every backend's plan() repeats before it indexes anything: the head layout, the
 * query's length and `query_start_loc`. The service validates requests fully before a backend
 * sees them; these are the cheap defensive checks a backend keeps for direct library callers.
 * @module
 */
import { invalidBatch } from "./errors.ts";
import type { ForwardBatch } from "./types.ts";

/**
 * Throws a 422 `invalid_batch` naming the field when num_heads is not a multiple of
 * num_kv_heads, the query's length disagrees with the layer, or `query_start_loc` does not
 * run non-decreasing from 0 to num_tokens.
 */
export function checkQueryLayout(b: ForwardBatch): void {
  const L = b.layer, md = b.metadata, T = b.num_tokens;
  if (L.num_kv_heads < 1 || L.num_heads % L.num_kv_heads !== 0) {
    throw invalidBatch([{
      path: ["layer", "num_heads"],
      message: `${L.num_heads} is not a multiple of num_kv_heads ${L.num_kv_heads}`,
    }]);
  }
  if (b.query.length !== T * L.num_heads * L.head_size) {
    throw invalidBatch([{
      path: ["query"],
      message: `has ${b.query.length} elements, expected ${T}x${L.num_heads}x${L.head_size}`,
    }]);
  }
  for (let i = 0; i <= md.num_reqs; i++) {
    const q = md.query_start_loc[i], prev = i === 0 ? 0 : md.query_start_loc[i - 1];
    if (q < prev || (i === 0 && q !== 0) || (i === md.num_reqs && q !== T)) {
      throw invalidBatch([{
        path: ["metadata", "query_start_loc", i],
        message: `is ${q}: must run non-decreasing from 0 to num_tokens ${T}`,
      }]);
    }
  }
}
