/**
 * The OpenAPI 3.1 document, generated from the zod schemas that validate requests
 * (`z.toJSONSchema` over the global registry: every schema with an `id` is a component).
 * Every operation but `/healthz` may answer 401 (a token is configured and missing or wrong) or
 * 403 (a loopback bind without a token and a foreign Host); the bearer scheme is optional
 * because the server's configuration decides it.
 * @module
 */
import { z } from "zod";
import * as S from "../wire/schemas.ts";

const ref = (id: string) => ({ $ref: `#/components/schemas/${id}` });
const json = (id: string) => ({ "application/json": { schema: ref(id) } });
const problem = (description: string) => ({
  description,
  content: { "application/problem+json": { schema: ref("Problem") } },
});
const errors = (...codes: number[]) => {
  const text: Record<number, string> = {
    400: "Malformed body or schema violation",
    404: "Unknown cache or backend",
    413: "Body over the limit",
    415: "Unsupported content type",
    422: "Parses but cannot run",
    503: "No device or device lost (with Retry-After)",
  };
  return Object.fromEntries(codes.map((c) => [String(c), problem(text[c])]));
};
const safetensors = {
  "application/octet-stream": {
    schema: {
      type: "string",
      contentMediaType: "application/octet-stream",
      description: "A safetensors file.",
    },
  },
};
const idParam = [{ name: "id", in: "path", required: true, schema: { type: "string" } }];

let cached: Record<string, unknown> | undefined;

/** Builds (once) and returns the OpenAPI document. */
export function openApiDocument(): Record<string, unknown> {
  if (cached) return cached;
  // Touch the schemas so their registry entries exist, then convert the whole registry.
  void S.ProblemSchema;
  const { schemas } = z.toJSONSchema(z.globalRegistry, {
    target: "draft-2020-12",
    io: "input",
    uri: (id) => `#/components/schemas/${id}`,
  }) as { schemas: Record<string, Record<string, unknown>> };
  for (const s of Object.values(schemas)) {
    delete s.$schema;
    delete s.$id;
  }
  cached = {
    openapi: "3.1.0",
    info: {
      title: "Attention service",
      version: "0.1.0",
      description: "Batched paged attention (vLLM v1 attention backend layer) as a REST service.",
    },
    paths: {
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
            ...errors(400, 404, 413, 415, 422),
          },
        },
      },
      "/v1/kv-caches": {
        post: {
          summary: "Create a server-held paged KV cache",
          requestBody: { required: true, content: json("CreateCacheRequest") },
          responses: {
            "201": { description: "Created", content: json("CacheInfo") },
            ...errors(400, 404, 413, 415, 422, 503),
          },
        },
      },
      "/v1/kv-caches/{id}": {
        get: {
          summary: "A cache's spec and state",
          parameters: idParam,
          responses: { "200": { description: "OK", content: json("CacheInfo") }, ...errors(404) },
        },
        delete: {
          summary: "Free a cache (waits for its in-flight work)",
          parameters: idParam,
          responses: { "204": { description: "Deleted" }, ...errors(404) },
        },
      },
      "/v1/kv-caches/{id}/data": {
        get: {
          summary: "A cache's contents as safetensors (key_cache, value_cache)",
          parameters: idParam,
          responses: {
            "200": { description: "safetensors", content: safetensors },
            ...errors(404, 503),
          },
        },
      },
      "/v1/attention/forward": {
        post: {
          summary: "One batched paged-attention forward",
          description: "JSON body, or a safetensors body whose __metadata__.request holds " +
            "BinaryForwardRequest as JSON. Accept: application/octet-stream answers as safetensors.",
          requestBody: {
            required: true,
            content: { ...json("ForwardRequest"), ...safetensors },
          },
          responses: {
            "200": {
              description: "Output",
              content: { ...json("ForwardResponse"), ...safetensors },
            },
            ...errors(400, 404, 413, 415, 422, 503),
          },
        },
      },
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
        get: { summary: "This document", responses: { "200": { description: "OpenAPI 3.1" } } },
      },
    },
    components: {
      schemas,
      securitySchemes: { bearerAuth: { type: "http", scheme: "bearer" } },
    },
    security: [{}, { bearerAuth: [] }],
  };
  guardOperations(cached.paths as Record<string, Record<string, Operation>>);
  return cached;
}

type Operation = { responses: Record<string, unknown>; security?: unknown[] };

/** Adds the access-check answers (401, 403) to every operation but /healthz, which is open. */
function guardOperations(paths: Record<string, Record<string, Operation>>): void {
  for (const [path, ops] of Object.entries(paths)) {
    for (const op of Object.values(ops)) {
      if (path === "/healthz") {
        op.security = [];
        continue;
      }
      op.responses["401"] = problem("Bearer token missing or wrong (when the server has one)");
      op.responses["403"] = problem("Host not allowed (a loopback bind without a token)");
    }
  }
}
