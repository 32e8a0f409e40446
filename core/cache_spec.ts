/**
 * The one check of a KV cache spec that every way of making a cache (host or GPU) runs first.
 * @module
 */
import { ServiceError } from "./errors.ts";
import { DTYPES, KV_CACHE_DTYPES, KV_LAYOUTS, type KvCacheSpec } from "./types.ts";

/**
 * Refuses a spec the HTTP schema would refuse (a size that is not a positive integer, a dtype,
 * kv_cache_dtype or layout outside its list): every way a cache is made (HostKvCache, GpuKvCache) checks it first.
 * @throws ServiceError 422 `invalid_cache_spec` naming the field and its value.
 */
export function checkCacheSpec(spec: KvCacheSpec): void {
  for (const f of ["num_blocks", "block_size", "num_kv_heads", "head_size"] as const) {
    const v = spec[f];
    if (!Number.isSafeInteger(v) || v < 1) {
      throw new ServiceError(`${f} must be a positive integer, got ${v}`, {
        status: 422,
        code: "invalid_cache_spec",
        issues: [{ path: [f], message: `must be a positive integer, got ${v}` }],
      });
    }
  }
  // The values the HTTP schema admits (wire/schemas.ts builds its enums from the same lists).
  const oneOf = [
    ["dtype", DTYPES],
    ["kv_cache_dtype", KV_CACHE_DTYPES],
    ["layout", KV_LAYOUTS],
  ] as const;
  for (const [f, allowed] of oneOf) {
    const v: string = spec[f];
    if (!(allowed as readonly string[]).includes(v)) {
      const must = `must be ${allowed.slice(0, -1).join(", ")} or ${allowed.at(-1)}, got ${v}`;
      throw new ServiceError(`${f} ${must}`, {
        status: 422,
        code: "invalid_cache_spec",
        issues: [{ path: [f], message: must }],
      });
    }
  }
}
