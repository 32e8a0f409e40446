/**
 * The OpenAPI 3.1 document, generated from the zod schemas that validate requests
 * (`z.toJSONSchema` over the global registry: every schema with an `id` is a component).
 * Each operation lists every status it can answer: its own, plus 400, 405, 500 and 503 on all of
 * them, and 401 (a token is configured and missing or wrong) and 403 (a loopback bind without a
 * token and a foreign Host) on all but `/healthz`; the bearer scheme is optional because the
 * server's configuration decides it. tests/server/openapi_test.ts checks the list against what
 * the routes answer. The paths are written here with the pieces of server/openapi_parts.ts; what
 * every operation has in common (those statuses, HEAD operations, response headers) is added by
 * server/openapi_every_operation.ts.
 * @module
 */
import { z } from "zod";
import * as S from "../wire/schemas.ts";
import {
  addHeadOperations,
  addResponseHeaders,
  guardOperations,
  type Operation,
} from "./openapi_every_operation.ts";
import {
  cacheInfo,
  errors,
  forwardBody,
  forwardResponses,
  idParam,
  json,
  queueTimeoutParam,
  safetensors,
} from "./openapi_parts.ts";

let cached: Record<string, unknown> | undefined;

/** Builds (once) and returns the OpenAPI document. */
export function openApiDocument(): Record<string, unknown> {
  if (cached) return cached;
  cached = {
    openapi: "3.1.0",
    info: {
      title: "Attention service",
      version: "0.1.0",
      description: "Batched paged attention (vLLM v1 attention backend layer) as a REST service.",
    },
    paths: {
      ...discoveryPaths(),
      ...cachePaths(),
      ...forwardPaths(),
      ...documentPaths(),
    },
    components: {
      schemas: componentSchemas(),
      securitySchemes: { bearerAuth: { type: "http", scheme: "bearer" } },
    },
    security: [{}, { bearerAuth: [] }],
  };
  const paths = cached.paths as Record<string, Record<string, Operation>>;
  guardOperations(paths);
  addHeadOperations(paths);
  addResponseHeaders(paths);
  return cached;
}

/** Every schema of the zod registry, as JSON Schema (draft 2020-12, the request side). */
function componentSchemas(): Record<string, Record<string, unknown>> {
  // Touch the schemas so their registry entries exist, then convert the whole registry.
  void S.ProblemSchema;
  const { schemas } = z.toJSONSchema(z.globalRegistry, {
    target: "draft-2020-12",
    io: "input",
    uri: (id) => `#/components/schemas/${id}`,
    // The tensors' `data` elements are z.custom (wire/field_schemas.ts jsonNumber); their meta
    // gives the type.
    unrepresentable: "any",
  }) as { schemas: Record<string, Record<string, unknown>> };
  for (const s of Object.values(schemas)) {
    delete s.$schema;
    delete s.$id;
  }
  return schemas;
}

/** Liveness, the device, the backends and the selector. */
function discoveryPaths(): Record<string, unknown> {
  return {
    "/healthz": {
      get: {
        summary: "Liveness",
        responses: { "200": { description: "OK", content: json("Health") } },
      },
    },
    "/v1/device": {
      get: {
        summary: "The WebGPU adapter in use",
        responses: { "200": { description: "OK", content: json("DeviceReport") } },
      },
    },
    "/v1/backends": {
      get: {
        summary: "Backends and capabilities",
        responses: { "200": { description: "OK", content: json("Backends") } },
      },
    },
    "/v1/backends/select": {
      post: {
        summary: "Select a backend for a vLLM selector config",
        requestBody: { required: true, content: json("SelectRequest") },
        responses: {
          "200": { description: "Selected", content: json("SelectResponse") },
          ...errors(400, 404, 408, 413, 415, 422),
        },
      },
    },
  };
}

/** The server-held caches: create, read, delete, their data. */
function cachePaths(): Record<string, unknown> {
  return {
    "/v1/kv-caches": {
      post: {
        summary: "Create a server-held paged KV cache (the server chooses its id)",
        requestBody: { required: true, content: json("CreateCacheRequest") },
        responses: {
          "201": cacheInfo("Created"),
          ...errors(400, 404, 408, 413, 415, 422),
        },
      },
    },
    "/v1/kv-caches/{id}": {
      put: {
        summary: "Create the cache {id} (the client chooses the id; idempotent for one spec)",
        description: "The route to use behind a proxy that routes on the cache id.",
        parameters: idParam,
        requestBody: { required: true, content: json("CreateCacheRequest") },
        responses: {
          "200": cacheInfo("The cache exists with this spec"),
          "201": cacheInfo("Created"),
          ...errors(400, 404, 408, 409, 413, 415, 422),
        },
      },
      get: {
        summary: "A cache's spec and state",
        parameters: idParam,
        responses: { "200": cacheInfo("OK"), ...errors(400, 404) },
      },
      delete: {
        summary: "Free a cache (waits for its in-flight work)",
        parameters: idParam,
        responses: { "204": { description: "Deleted" }, ...errors(400, 404) },
      },
    },
    "/v1/kv-caches/{id}/data": {
      get: {
        summary: "A cache's contents as safetensors (key_cache, value_cache)",
        parameters: idParam,
        responses: {
          "200": { description: "safetensors", content: safetensors },
          ...errors(400, 404),
        },
      },
      put: {
        summary: "Replace a cache's contents with a safetensors file (as GET answers it)",
        description: "Checked against the cache (dtype, shape, __metadata__ layout/dtype/" +
          "kv_cache_dtype: 422 cache_data_mismatch), then swapped in whole; a failure changes " +
          "nothing. The cache must exist (PUT /v1/kv-caches/{id} first).",
        parameters: idParam,
        requestBody: { required: true, content: safetensors },
        responses: { "200": cacheInfo("Imported"), ...errors(400, 404, 408, 413, 415, 422) },
      },
    },
  };
}

/** The forward calls, on a cache's path and on the general one. */
function forwardPaths(): Record<string, unknown> {
  return {
    "/v1/kv-caches/{id}/forward": {
      post: {
        summary: "One batched paged-attention forward on the cache {id}",
        description: "As POST /v1/attention/forward, with the cache named by the path (the " +
          "route to use behind a proxy). The body leaves kv_cache out or names {id}; another " +
          "id is a 400 kv_cache_mismatch.",
        parameters: [...idParam, queueTimeoutParam],
        requestBody: forwardBody,
        responses: forwardResponses,
      },
    },
    "/v1/attention/forward": {
      post: {
        summary: "One batched paged-attention forward",
        description: "JSON body, or a safetensors body whose __metadata__.request holds " +
          "BinaryForwardRequest as JSON. Accept: application/octet-stream answers as safetensors.",
        parameters: [queueTimeoutParam],
        requestBody: forwardBody,
        responses: forwardResponses,
      },
    },
  };
}

/** The metrics and this document. */
function documentPaths(): Record<string, unknown> {
  return {
    "/metrics": {
      get: {
        summary: "Prometheus metrics",
        responses: {
          "200": {
            description: "text format",
            content: { "text/plain": { schema: { type: "string" } } },
          },
        },
      },
    },
    "/openapi.json": {
      get: {
        summary: "This document",
        responses: {
          "200": {
            description: "OpenAPI 3.1",
            content: { "application/json": { schema: { type: "object" } } },
          },
        },
      },
    },
  };
}
