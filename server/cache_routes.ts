/**
 * The server-held cache routes: create with a server-chosen id (`POST /v1/kv-caches`) or the
 * client's (`PUT /v1/kv-caches/{id}`: 201 created, 200 the same spec again, 409 another spec),
 * read the spec, delete, export the contents as safetensors (`GET .../data`) and import them
 * back (`PUT .../data`, the inverse: checked against the cache, then swapped in whole). Every
 * `{id}` is percent-decoded and checked against the cache id rule first (400
 * `invalid_cache_id` naming the value).
 * @module
 */
import { ServiceError } from "../core/errors.ts";
import type { AttentionService } from "../service/service.ts";
import {
  cacheSafetensorsLength,
  cacheSafetensorsParts,
  parseCacheFile,
} from "../wire/cache_file.ts";
import { CACHE_ID_PATTERN, CACHE_ID_RULE } from "../wire/names.ts";
import { CreateCacheRequestSchema } from "../wire/schemas.ts";
import type { CreateCacheRequest } from "../wire/types.ts";
import { showValue } from "../wire/zod_issues.ts";
import { bodyKind, type BodyLimit, type BodyLimits, jsonBody, readBody } from "./body.ts";
import { binaryResponse, jsonResponse, SAFETENSORS } from "./responses.ts";
import type { Router } from "./routes.ts";

/**
 * A cache id from the path: percent-decoded, then checked against {@link CACHE_ID_PATTERN}.
 * @throws ServiceError 400 `invalid_cache_id` with an issue at `["id"]` naming the value.
 */
export function cacheIdParam(raw: string): string {
  let id: string | null;
  try {
    id = decodeURIComponent(raw);
  } catch {
    id = null;
  }
  if (id !== null && CACHE_ID_PATTERN.test(id)) return id;
  const got = showValue(id ?? raw);
  throw new ServiceError(`path parameter id ${got} is not a cache id: ${CACHE_ID_RULE}`, {
    status: 400,
    code: "invalid_cache_id",
    issues: [{ path: ["id"], message: `must be ${CACHE_ID_RULE}; got ${got}` }],
  });
}

const location = (id: string) => ({ location: `/v1/kv-caches/${id}` });

/** Adds the cache routes. */
export function addCacheRoutes(router: Router, service: AttentionService, limits: BodyLimits) {
  const create = (req: Request): Promise<CreateCacheRequest> =>
    jsonBody(req, limits, CreateCacheRequestSchema);

  router.add("POST", "/v1/kv-caches", async ({ req }) => {
    const info = await service.createCache(await create(req));
    return jsonResponse(info, 201, location(info.id));
  });
  router.add("PUT", "/v1/kv-caches/:id", async ({ req, params }) => {
    const id = cacheIdParam(params.id);
    const { info, created } = await service.putCache(id, await create(req));
    return jsonResponse(info, created ? 201 : 200, location(id));
  });
  router.add(
    "GET",
    "/v1/kv-caches/:id",
    ({ params }) => jsonResponse(service.getCache(cacheIdParam(params.id))),
  );
  router.add("DELETE", "/v1/kv-caches/:id", async ({ params }) => {
    await service.deleteCache(cacheIdParam(params.id));
    return new Response(null, { status: 204 });
  });
  // The export goes out as its parts (header, key, value), uncopied; a HEAD is answered from
  // the cache's spec without reading the cache.
  router.add("GET", "/v1/kv-caches/:id/data", async ({ req, params }) => {
    const id = cacheIdParam(params.id);
    const disposition = {
      "content-disposition": `attachment; filename="kv-cache-${id}.safetensors"`,
    };
    if (req.method.toUpperCase() === "HEAD") {
      const length = cacheSafetensorsLength(service.cacheDataInfo(id));
      return new Response(null, {
        headers: { "content-type": SAFETENSORS, ...disposition, "content-length": String(length) },
      });
    }
    return binaryResponse(cacheSafetensorsParts(await service.cacheData(id)), disposition);
  });
  router.add("PUT", "/v1/kv-caches/:id/data", async ({ req, params }) => {
    const id = cacheIdParam(params.id);
    const info = service.getCache(id); // 404 before reading a body meant for no cache
    bodyKind(req, ["binary"]);
    const file = parseCacheFile(await readImport(req, limits.binary, info.bytes));
    return jsonResponse(await service.importCacheData(id, file));
  });
}

/**
 * An import's body, within the server's body limit. A cache whose export is larger (its
 * `bytes` and a header) cannot come back through this server: the 413 says so, with the
 * cache's bytes and the flag that would take it.
 */
async function readImport(
  req: Request,
  limit: BodyLimit,
  cacheBytes: number,
): Promise<Uint8Array> {
  try {
    return await readBody(req, limit);
  } catch (e) {
    const over = e instanceof ServiceError && e.code === "body_too_large";
    if (!over || cacheBytes <= limit.bytes) throw e;
    throw new ServiceError(
      `${e.message}: this cache holds ${cacheBytes} bytes, so its export (those and a header ` +
        `of under 1 KiB) is over the limit; a server started with --max-body-bytes of at least ` +
        `${cacheBytes + 1024} imports it`,
      { status: 413, code: "body_too_large", extra: { ...e.extra, cache_bytes: cacheBytes } },
    );
  }
}
