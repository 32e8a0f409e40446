/**
 * The OpenAPI 3.1 document, generated from the zod schemas that validate requests
 * (`z.toJSONSchema` over the global registry: every schema with an `id` is a component).
 * Each operation lists every status it can answer: its own, plus 400, 405, 500 and 503 on all of
 * them, and 401 (a token is configured and missing or wrong) and 403 (a loopback bind without a
 * token and a foreign Host) on all but `/healthz`; the bearer scheme is optional because the
 * server's configuration decides it. tests/server/openapi_test.ts checks the list against what
 * the routes answer.
 * @module
 */
import { z } from "zod";
import * as S from "../wire/schemas.ts";
import { QUEUE_TIMEOUT_HEADER } from "../wire/names.ts";

const ref = (id: string) => ({ $ref: `#/components/schemas/${id}` });
const json = (id: string) => ({ "application/json": { schema: ref(id) } });
const problem = (description: string) => ({
  description,
  content: { "application/problem+json": { schema: ref("Problem") } },
});
const ERROR_TEXT: Record<number, string> = {
  400: "Malformed body, schema violation or invalid cache id (issues name each field and " +
    "value), or a header refused (invalid_header: header and value)",
  404: "Unknown cache or backend",
  408: "The body stopped coming (--body-timeout-ms)",
  409: "The cache exists with another spec",
  413: "Body over the limit",
  406: "Accept takes neither answer (application/json, application/octet-stream); nothing ran",
  415: "Unsupported content type",
  422: "Parses but cannot run",
  499: "The client went away before the call ran (nobody reads it; logs and metrics do)",
};
const errors = (...codes: number[]) =>
  Object.fromEntries(codes.map((c) => [String(c), problem(ERROR_TEXT[c])]));
const safetensors = {
  "application/octet-stream": {
    schema: {
      type: "string",
      contentMediaType: "application/octet-stream",
      description: "A safetensors file.",
    },
  },
};
const idParam = [{ name: "id", in: "path", required: true, schema: ref("CacheId") }];
/** The forward routes' queue timeout (core/queue_timeout.ts). */
const queueTimeoutParam = {
  name: QUEUE_TIMEOUT_HEADER,
  in: "header",
  required: false,
  description: "The most ms the call may wait to start once its body arrived (behind earlier " +
    "calls on its cache, for the device); past it: 503 queue_timeout, the call did not run and " +
    "wrote nothing. A plain decimal above 0 and at most 2147483647; another value is a 400 " +
    "invalid_header.",
  schema: { type: "string", pattern: "^\\d+(\\.\\d+)?$", examples: ["20", "0.5"] },
};
const cacheInfo = (description: string) => ({ description, content: json("CacheInfo") });

const forwardBody = {
  required: true,
  content: { ...json("ForwardRequest"), ...safetensors },
};
const forwardResponses = {
  "200": { description: "Output", content: { ...json("ForwardResponse"), ...safetensors } },
  ...errors(400, 404, 406, 408, 413, 415, 422, 499),
};

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
    // The tensors' `data` elements are z.custom (wire/field_schemas.ts jsonNumber); their meta
    // gives the type.
    unrepresentable: "any",
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
            ...errors(400, 404, 408, 413, 415, 422),
          },
        },
      },
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
    },
    components: {
      schemas,
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

type Response = { description: string; content?: unknown; headers?: Record<string, unknown> };
type Operation = {
  summary?: string;
  parameters?: unknown[];
  responses: Record<string, Response>;
  security?: unknown[];
};

const header = (description: string) => ({ description, schema: { type: "string" } });

/** Every GET path answers HEAD: the GET's parameters, statuses and access rule, no body. */
function addHeadOperations(paths: Record<string, Record<string, Operation>>): void {
  for (const ops of Object.values(paths)) {
    const get = ops.get;
    if (!get) continue;
    const responses = Object.fromEntries(
      Object.entries(get.responses).map(([k, r]) => [k, { description: r.description }]),
    );
    ops.head = {
      summary: `${get.summary} (headers only)`,
      ...(get.parameters ? { parameters: get.parameters } : {}),
      responses,
      ...(get.security ? { security: get.security } : {}),
    };
  }
}

/** The headers of a forward route's 200: the backend and, where its plan records them, its paths. */
const FORWARD_OK_HEADERS = {
  "X-Attention-Backend": header("The backend that ran the call"),
  "X-Attention-Paths": header(
    "Which kernels ran each part of the batch, an RFC 8941 dictionary of tokens " +
      "(`decode=split_kv, prefill=tensor_core`; paths split_kv, tensor_core, tiles). Sent by " +
      "backends whose plan records its paths (WEBGPU_FLASH), on a batch with rows; not by " +
      "CPU_REFERENCE or WEBGPU_DECODE",
  ),
  "X-Attention-Path-Reasons": header(
    "Why a part is not on its preferred kernels (decode rows: split_kv, prefill rows: " +
      'tensor_core), an RFC 8941 dictionary of strings (`prefill="dtype not supported (got ' +
      'float32; supported: float16, bfloat16)"`); absent where every part is on them',
  ),
};

/** How the statuses only `--http-engine http1` answers itself are described. */
const HTTP1_ONLY =
  ", with --http-engine http1 only: the service's own HTTP/1.1 server answers it before any " +
  "route runs";

/**
 * The statuses the http1 engine answers before any route runs (server/http1_head.ts,
 * http1_refusals.ts), on every operation; its 408 (head_timeout) is added where an operation has
 * none of its own.
 */
const HTTP1_OWN: Record<string, string> = {
  "417": "An Expect other than 100-continue (expectation_failed)",
  "431": "A request head over its size or field count (headers_too_large)",
  "501": "A method it does not serve (lowercase, TRACE: method_not_implemented) or a transfer " +
    "coding other than chunked (not_implemented)",
  "505": "An HTTP version other than 1.0 or 1.1 (http_version_not_supported)",
};

/**
 * The response headers the server sends: `Location` on a 201 and on `PUT /v1/kv-caches/{id}`'s
 * 200, `Content-Disposition` on a cache export's 200, `Accept-Encoding` on a 415, `Allow` on a 405,
 * `WWW-Authenticate` on a 401, `Retry-After` on a 503, `Server-Timing` on the forward routes'
 * answers (not 401, 403, 405 and {@link HTTP1_OWN}: given before the route runs),
 * {@link FORWARD_OK_HEADERS} on their 200s, and `X-Attention-Instance` on every answer of a
 * server started with `--instance-name`.
 */
function addResponseHeaders(paths: Record<string, Record<string, Operation>>): void {
  for (const [path, ops] of Object.entries(paths)) {
    for (const op of Object.values(ops)) {
      for (const [status, r] of Object.entries(op.responses)) {
        const h: Record<string, unknown> = {
          "X-Attention-Instance": header("This instance's name (servers with --instance-name)"),
        };
        if (status === "201") h.Location = header("The created cache, /v1/kv-caches/{id}");
        const put = path === "/v1/kv-caches/{id}" && "put" in ops && ops.put === op;
        if (status === "200" && put) h.Location = header("The cache, /v1/kv-caches/{id}");
        if (status === "200" && path === "/v1/kv-caches/{id}/data" && !("requestBody" in op)) {
          h["Content-Disposition"] = header('attachment; filename="kv-cache-{id}.safetensors"');
        }
        if (status === "415" && "requestBody" in op) {
          h["Accept-Encoding"] = header("identity (on unsupported_content_encoding)");
        }
        if (status === "405") h.Allow = header("The path's methods");
        if (status === "401") h["WWW-Authenticate"] = header("Bearer");
        if (status === "503") {
          h["Retry-After"] = header("Seconds to wait (not on a problem with retryable: false)");
        }
        // Not on the answers given before the forward route runs (docs/api.md): the access
        // checks, 405, and the http1 engine's own refusals.
        const beforeRoute = ["401", "403", "405"].includes(status) || status in HTTP1_OWN;
        if (path.endsWith("/forward") && !beforeRoute) {
          h["Server-Timing"] = header(
            status === "503" ? "parse;dur=MS (not on a 503 shutting_down)" : "parse;dur=MS",
          );
          if (status === "200") Object.assign(h, FORWARD_OK_HEADERS);
        }
        op.responses[status] = { ...r, headers: { ...r.headers, ...h } };
      }
    }
  }
}

/**
 * Adds the answers every operation can give: 400 (a Host header no URL can be built from; an
 * operation's own 400 covers it), 405 (another method on the path; `Allow` lists the
 * path's methods), 500 (an unexpected error, logged with the id the detail names) and 503 (no
 * device, device lost, or shutting down; with Retry-After); and the access-check answers (401,
 * 403) to every operation but /healthz, which is open.
 */
function guardOperations(paths: Record<string, Record<string, Operation>>): void {
  for (const [path, ops] of Object.entries(paths)) {
    for (const op of Object.values(ops)) {
      op.responses["400"] ??= problem(
        "Request URL not valid: a Host header that is no URL authority (bad_request)",
      );
      op.responses["405"] = problem("Method not allowed on this path (Allow lists its methods)");
      op.responses["500"] = problem("Unexpected error (logged server-side with the error id)");
      op.responses["503"] = problem(
        "No device, device lost, or shutting down (with Retry-After; none where retrying " +
          "cannot help: retryable false, no device by configuration)" +
          (path.endsWith("/forward")
            ? "; or queue_timeout: the call waited past its X-Attention-Queue-Timeout-Ms and " +
              "did not run (Retry-After: 0)"
            : ""),
      );
      op.responses["408"] ??= problem(
        `A request head not whole in time (head_timeout)${HTTP1_ONLY}`,
      );
      for (const [status, what] of Object.entries(HTTP1_OWN)) {
        op.responses[status] = problem(what + HTTP1_ONLY);
      }
      if (path === "/healthz") {
        op.security = [];
        continue;
      }
      op.responses["401"] = problem("Bearer token missing or wrong (when the server has one)");
      op.responses["403"] = problem("Host not allowed (a loopback bind without a token)");
    }
  }
}
