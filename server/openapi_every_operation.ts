/**
 * What the OpenAPI document (server/openapi.ts) adds to the operations its paths list, over all
 * of them: the statuses every operation can answer ({@link guardOperations}: 400, 405, 500 and
 * 503 on all, 401 and 403 on all but `/healthz`, and the http1 engine's own refusals), a HEAD
 * operation for every GET ({@link addHeadOperations}), and the response headers of each answer
 * ({@link addResponseHeaders}).
 * @module
 */
import { problem } from "./openapi_parts.ts";

type Response = {
  description: string;
  content?: unknown;
  headers?: Record<string, unknown>;
};
/** One operation of the document's paths, as these passes read and change it. */
export type Operation = {
  summary?: string;
  parameters?: unknown[];
  responses: Record<string, Response>;
  security?: unknown[];
};

const header = (description: string) => ({ description, schema: { type: "string" } });

/** Every GET path answers HEAD: the GET's parameters, statuses and access rule, no body. */
export function addHeadOperations(paths: Record<string, Record<string, Operation>>): void {
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
export function addResponseHeaders(paths: Record<string, Record<string, Operation>>): void {
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
export function guardOperations(paths: Record<string, Record<string, Operation>>): void {
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
