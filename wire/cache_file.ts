/**
 * A server-held cache's contents on the wire: one safetensors file with the tensors `key_cache`
 * and `value_cache` (the storage dtype's little-endian bytes, shaped by the layout) and a
 * `__metadata__` naming the spec (`id`, `layout`, `dtype`, `kv_cache_dtype`, `backend`).
 * `GET /v1/kv-caches/{id}/data` answers one ({@link cacheSafetensors}); `PUT` of the same path
 * takes one back ({@link parseCacheFile}, then {@link checkCacheFile} against the target cache),
 * so an export from one instance imports into another.
 * @module
 */
import { resolveStorage } from "../core/dtype.ts";
import { type Issue, ServiceError } from "../core/errors.ts";
import {
  concatBytes,
  parseSafetensors,
  safetensorsHead,
  safetensorsParts,
  type SafetensorsTensor,
  serializeSafetensors,
} from "../core/safetensors.ts";
import type { KvCacheSpec } from "../core/types.ts";
import type { CacheInfo, CreateCacheRequest } from "./types.ts";
import { scanSafetensorsHeader } from "./json_scan.ts";
import { safetensorsDtype } from "./tensors.ts";

/** A cache's contents, in its storage dtype and layout shape. */
export interface CacheData {
  info: CacheInfo;
  /** [num_blocks, block_size, num_kv_heads, head_size] (NHD) or [num_blocks, num_kv_heads, block_size, head_size] (HND). */
  shape: number[];
  key: Uint8Array;
  value: Uint8Array;
}

/** A parsed cache file. */
export interface CacheFile {
  key_cache: SafetensorsTensor;
  value_cache: SafetensorsTensor;
  /** The file's `__metadata__` ({} when it has none). */
  metadata: Record<string, string>;
}

/** The tensors a cache file holds, and nothing else. */
export const CACHE_FILE_TENSORS = ["key_cache", "value_cache"] as const;

/** The `__metadata__` keys checked against the target cache on import (`id` and `backend` are not). */
const CHECKED_METADATA = ["layout", "dtype", "kv_cache_dtype"] as const;

/** The shape of a cache tensor in its layout. */
export function cacheShape(spec: KvCacheSpec): number[] {
  return spec.layout === "NHD"
    ? [spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size]
    : [spec.num_blocks, spec.num_kv_heads, spec.block_size, spec.head_size];
}

/**
 * The create request that makes a cache like `info` (its spec; not its backend: the target
 * chooses one its device has): what a move sends to `PUT /v1/kv-caches/{id}` on the target
 * before `PUT .../data`.
 */
export function createRequestOf(info: CacheInfo): CreateCacheRequest {
  const { num_blocks, block_size, num_kv_heads, head_size, dtype, kv_cache_dtype, layout } = info;
  return { num_blocks, block_size, num_kv_heads, head_size, dtype, kv_cache_dtype, layout };
}

/** A parsed cache file as bytes again (the tensors and `__metadata__` it held). */
export function cacheFileBytes(f: CacheFile): Uint8Array {
  return serializeSafetensors({ key_cache: f.key_cache, value_cache: f.value_cache }, f.metadata);
}

/** The `__metadata__` of a cache's file: its spec. */
function fileMetadata(info: CacheInfo): Record<string, string> {
  return {
    id: info.id,
    layout: info.layout,
    dtype: info.dtype,
    kv_cache_dtype: info.kv_cache_dtype,
    backend: info.backend,
  };
}

/** A cache's contents as safetensors parts (header, `key_cache`, `value_cache`), uncopied. */
export function cacheSafetensorsParts(d: CacheData): Uint8Array[] {
  const dtype = safetensorsDtype(d.info.storage_dtype);
  return safetensorsParts(
    {
      key_cache: { dtype, shape: d.shape, data: d.key },
      value_cache: { dtype, shape: d.shape, data: d.value },
    },
    fileMetadata(d.info),
  );
}

/** A cache's contents as one safetensors file (`key_cache`, `value_cache`; metadata its spec). */
export function cacheSafetensors(d: CacheData): Uint8Array {
  return concatBytes(cacheSafetensorsParts(d));
}

/**
 * The byte length of {@link cacheSafetensors} for a cache, from its info and shape alone (its
 * contents are not read): `HEAD .../data`.
 */
export function cacheSafetensorsLength(d: Pick<CacheData, "info" | "shape">): number {
  const dtype = safetensorsDtype(d.info.storage_dtype);
  const t = { dtype, shape: d.shape };
  const { head, data_bytes } = safetensorsHead(
    { key_cache: t, value_cache: t },
    fileMetadata(d.info),
  );
  return head.byteLength + data_bytes;
}

/**
 * Parses a cache file: a valid safetensors file holding exactly `key_cache` and `value_cache`.
 * @throws ServiceError 400 `bad_safetensors` (not a safetensors file), the JSON pre-scan's
 *   400/413 (a header too deep or with too many values), or `invalid_request`
 *   (a tensor missing or unknown, each named in `issues`).
 */
export function parseCacheFile(bytes: Uint8Array): CacheFile {
  scanSafetensorsHeader(bytes);
  const file = parseSafetensors(bytes);
  const names = Object.keys(file.tensors);
  const issues: Issue[] = [
    ...CACHE_FILE_TENSORS.filter((n) => !file.tensors[n]).map((n) => ({
      path: [n],
      message: "required",
    })),
    ...names.filter((n) => !(CACHE_FILE_TENSORS as readonly string[]).includes(n)).map((n) => ({
      path: [n],
      message: `unknown tensor ${JSON.stringify(n)}; a cache file holds key_cache and value_cache`,
    })),
  ];
  if (issues.length) {
    throw new ServiceError(
      `a cache file holds exactly key_cache and value_cache, got ${
        names.length ? names.join(", ") : "no tensors"
      }`,
      { status: 400, code: "invalid_request", issues },
    );
  }
  return {
    key_cache: file.tensors.key_cache,
    value_cache: file.tensors.value_cache,
    metadata: file.metadata,
  };
}

/**
 * Checks a parsed cache file against the cache it is imported into: each tensor's dtype is the
 * cache's storage dtype and its shape the layout's, and the `__metadata__` entries `layout`,
 * `dtype` and `kv_cache_dtype`, where present, equal the cache's (`auto` compares as resolved).
 * @throws ServiceError 422 `cache_data_mismatch` listing every disagreement with both values.
 */
export function checkCacheFile(file: CacheFile, spec: KvCacheSpec, cacheId: string): void {
  const storage = resolveStorage(spec.kv_cache_dtype, spec.dtype);
  const dtype = safetensorsDtype(storage);
  const shape = cacheShape(spec);
  const issues: Issue[] = [];
  for (const name of CACHE_FILE_TENSORS) {
    const t = file[name];
    if (t.dtype !== dtype) {
      issues.push({
        path: [name, "dtype"],
        message: `is ${t.dtype} but cache ${cacheId} stores ${dtype} (${storage})`,
      });
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      issues.push({
        path: [name, "shape"],
        message: `is ${JSON.stringify(t.shape)} but cache ${cacheId} (${spec.layout}) is ${
          JSON.stringify(shape)
        }`,
      });
    }
  }
  const want: Record<(typeof CHECKED_METADATA)[number], string> = {
    layout: spec.layout,
    dtype: spec.dtype,
    kv_cache_dtype: storage,
  };
  for (const k of CHECKED_METADATA) {
    const got = file.metadata[k];
    if (got === undefined) continue;
    // `auto` and `fp8` name a storage dtype through the data dtype / vLLM's alias.
    const resolved = k === "kv_cache_dtype" && (got === "auto" || got === "fp8")
      ? resolveStorage(got, (file.metadata.dtype ?? spec.dtype) as KvCacheSpec["dtype"])
      : got;
    if (resolved !== want[k]) {
      issues.push({
        path: ["__metadata__", k],
        message: `is ${JSON.stringify(got)} but cache ${cacheId} has ${JSON.stringify(want[k])}`,
      });
    }
  }
  if (issues.length) {
    throw new ServiceError(
      `the file does not fit cache ${cacheId}: ${issues[0].path.join(".")} ${issues[0].message}${
        issues.length > 1 ? ` (and ${issues.length - 1} more)` : ""
      }`,
      { status: 422, code: "cache_data_mismatch", issues, extra: { cache_id: cacheId } },
    );
  }
}
