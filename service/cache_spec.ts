/**
 * A create-cache request as a {@link KvCacheSpec} (defaults applied), and the comparison that
 * makes `PUT /v1/kv-caches/{id}` idempotent: the same spec (and no other forced backend) is the
 * same cache; anything else is a 409 `cache_conflict` naming each field that differs, with the
 * held and the requested value.
 * @module
 */
import { resolveStorage } from "../core/dtype.ts";
import { type Issue, ServiceError } from "../core/errors.ts";
import type { KvCacheSpec } from "../core/types.ts";
import type { CreateCacheRequest } from "../wire/types.ts";

/** The spec a create request asks for (`kv_cache_dtype` default auto, `layout` default NHD). */
export function specOf(req: CreateCacheRequest): KvCacheSpec {
  return {
    num_blocks: req.num_blocks,
    block_size: req.block_size,
    num_kv_heads: req.num_kv_heads,
    head_size: req.head_size,
    dtype: req.dtype,
    kv_cache_dtype: req.kv_cache_dtype ?? "auto",
    layout: req.layout ?? "NHD",
  };
}

/** The fields compared, in the order docs/api.md lists them (kv_cache_dtype as stored). */
const FIELDS = [
  "num_blocks",
  "block_size",
  "num_kv_heads",
  "head_size",
  "dtype",
  "kv_cache_dtype",
  "layout",
] as const;

/**
 * Throws unless a held cache (its spec and backend) is what `req` asks for. `kv_cache_dtype`
 * compares as stored (`auto` = the data dtype); `backend` only when the request forces one.
 * @throws ServiceError 409 `cache_conflict` with one issue per differing field.
 */
export function requireSameSpec(
  id: string,
  held: { spec: KvCacheSpec; backend: string },
  req: CreateCacheRequest,
): void {
  const want = specOf(req);
  const issues: Issue[] = [];
  const differ = (field: string, got: unknown, has: unknown) =>
    issues.push({
      path: [field],
      message: `is ${JSON.stringify(got)} but cache ${id} has ${JSON.stringify(has)}`,
    });
  const storage = (s: KvCacheSpec) => resolveStorage(s.kv_cache_dtype, s.dtype);
  for (const f of FIELDS) {
    if (f !== "kv_cache_dtype") {
      if (want[f] !== held.spec[f]) differ(f, want[f], held.spec[f]);
    } else if (storage(want) !== storage(held.spec)) {
      // Two names of one storage match; shown with what each stores (`auto` over two dtypes).
      const shown = (s: KvCacheSpec) =>
        `${JSON.stringify(s.kv_cache_dtype)} (stores ${storage(s)})`;
      issues.push({
        path: [f],
        message: `is ${shown(want)} but cache ${id} has ${shown(held.spec)}`,
      });
    }
  }
  if (req.backend !== undefined && req.backend !== "auto" && req.backend !== held.backend) {
    differ("backend", req.backend, held.backend);
  }
  if (issues.length === 0) return;
  throw new ServiceError(
    `KV cache ${id} exists with another spec: ${issues[0].path[0]} ${issues[0].message}${
      issues.length > 1 ? ` (and ${issues.length - 1} more)` : ""
    }; DELETE it first or choose another id`,
    { status: 409, code: "cache_conflict", issues, extra: { cache_id: id } },
  );
}
