/**
 * The HTTP handler: `createHandler(service, opts)` returns a pure `(Request) => Promise<Response>`
 * (no Deno.serve here) implementing every endpoint of the contract. Errors are RFC 9457
 * problems; the handler never throws. The access check (token, Host) runs before routing;
 * HEAD answers a GET route's status and headers without its body; a forward call gets the
 * request's AbortSignal (aborted when the client goes away).
 * @module
 */
import type { z } from "zod";
import type { AttentionService } from "../service/service.ts";
import { accessCheck, type AccessPolicy } from "./auth.ts";
import {
  type BodyKind,
  bodyKind,
  type BodyLimit,
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_MAX_JSON_BODY_BYTES,
  parseJson,
  readBody,
  wantsBinary,
} from "./body.ts";
import {
  cacheSafetensors,
  decodeBinaryForward,
  decodeJsonForward,
  forwardJson,
  forwardSafetensors,
} from "../wire/codec.ts";
import { Metrics } from "./metrics.ts";
import { openApiDocument } from "./openapi.ts";
import {
  errorHeaders,
  type ErrorLogger,
  fromZod,
  problem,
  problemResponse,
  toProblem,
} from "./problem.ts";
import { type RouteContext, Router } from "./routes.ts";
import { CreateCacheRequestSchema, SelectRequestSchema } from "../wire/schemas.ts";

/** Options of {@link createHandler}. */
export interface HandlerOptions {
  /** Largest accepted request body in bytes (default 512 MiB). */
  maxBodyBytes?: number;
  /** Largest accepted JSON body in bytes (default 64 MiB; never more than maxBodyBytes). */
  maxJsonBodyBytes?: number;
  /** Token and Host checks (default: none). */
  access?: AccessPolicy;
  /** Where to count; a fresh {@link Metrics} wired to the service's caches by default. */
  metrics?: Metrics;
  /** Logs unexpected errors (default console.error). */
  log?: ErrorLogger;
}

const SAFETENSORS = "application/octet-stream";

function jsonResponse(body: unknown, status = 200, headers?: Record<string, string>): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

function binaryResponse(
  bytes: Uint8Array | Uint8Array[],
  headers?: Record<string, string>,
): Response {
  const parts = Array.isArray(bytes) ? bytes : [bytes];
  const length = parts.reduce((n, p) => n + p.byteLength, 0);
  const body = parts.length === 1 ? parts[0] as Uint8Array<ArrayBuffer> : new ReadableStream({
    start(c) {
      for (const p of parts) c.enqueue(p);
      c.close();
    },
  });
  return new Response(body, {
    status: 200,
    headers: { "content-type": SAFETENSORS, "content-length": String(length), ...headers },
  });
}

/** The size limit of each body kind: JSON's own, capped by the general one. */
type Limits = Record<BodyKind, BodyLimit>;

function bodyLimits(opts: HandlerOptions): Limits {
  const binary = { bytes: opts.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES, field: "max_body_bytes" };
  const json = opts.maxJsonBodyBytes ?? DEFAULT_MAX_JSON_BODY_BYTES;
  return {
    binary,
    json: json < binary.bytes
      ? { bytes: json, field: "max_json_body_bytes", kind: "JSON " }
      : { ...binary, kind: "JSON " },
  };
}

async function jsonBody<T>(req: Request, limits: Limits, schema: z.ZodType<T>): Promise<T> {
  bodyKind(req, ["json"]);
  const body = parseJson(await readBody(req, limits.json));
  const r = schema.safeParse(body);
  if (!r.success) throw fromZod(r.error, body);
  return r.data;
}

/** The answer to a HEAD request: the GET answer's status and headers, no body. */
async function headOf(res: Response): Promise<Response> {
  const headers = new Headers(res.headers);
  if (res.body && !headers.has("content-length")) {
    headers.set("content-length", String((await res.arrayBuffer()).byteLength));
  } else {
    await res.body?.cancel();
  }
  return new Response(null, { status: res.status, headers });
}

/** Builds the request handler for a service. */
export function createHandler(
  service: AttentionService,
  opts: HandlerOptions = {},
): (req: Request) => Promise<Response> {
  const limits = bodyLimits(opts);
  const checkAccess = accessCheck(opts.access ?? {});
  const metrics = opts.metrics ?? new Metrics({
    cacheBytes: () => service.caches.usedBytes,
    cacheCount: () => service.caches.list().length,
    cacheBudgetBytes: () => service.caches.budgetBytes,
  });
  const log = opts.log;
  const router = new Router();

  router.add("GET", "/healthz", () => jsonResponse({ status: "ok" }));
  router.add("GET", "/v1/device", () => jsonResponse(service.deviceReport()));
  router.add("GET", "/v1/backends", () => jsonResponse({ backends: service.backends() }));
  router.add("POST", "/v1/backends/select", async ({ req }) => {
    const { backend, ...cfg } = await jsonBody(req, limits, SelectRequestSchema);
    return jsonResponse(service.select(cfg, backend));
  });
  router.add("POST", "/v1/kv-caches", async ({ req }) => {
    const body = await jsonBody(req, limits, CreateCacheRequestSchema);
    const info = await service.createCache(body);
    return jsonResponse(info, 201, { location: `/v1/kv-caches/${info.id}` });
  });
  router.add("GET", "/v1/kv-caches/:id", ({ params }) => jsonResponse(service.getCache(params.id)));
  router.add("DELETE", "/v1/kv-caches/:id", async ({ params }) => {
    await service.deleteCache(params.id);
    return new Response(null, { status: 204 });
  });
  router.add("GET", "/v1/kv-caches/:id/data", async ({ params }) => {
    const data = await service.cacheData(params.id);
    return binaryResponse(cacheSafetensors(data), {
      "content-disposition": `attachment; filename="kv-cache-${data.info.id}.safetensors"`,
    });
  });
  router.add("POST", "/v1/attention/forward", async ({ req }) => {
    const kind = bodyKind(req, ["json", "binary"]);
    const bytes = await readBody(req, limits[kind]);
    const decoded = kind === "json"
      ? decodeJsonForward(parseJson(bytes))
      : decodeBinaryForward(bytes);
    const t0 = performance.now();
    const outcome = await service.forward(decoded.input, { signal: req.signal });
    metrics.recordForward(outcome.backend, (performance.now() - t0) / 1000);
    const headers = { "x-attention-backend": outcome.backend };
    if (wantsBinary(req)) return binaryResponse(forwardSafetensors(outcome), headers);
    return jsonResponse(forwardJson(outcome, decoded.encoding), 200, headers);
  });
  router.add(
    "GET",
    "/metrics",
    () =>
      new Response(metrics.render(), {
        headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
      }),
  );
  router.add("GET", "/openapi.json", () => jsonResponse(openApiDocument()));

  const respond = async (req: Request, url: URL): Promise<{ res: Response; route: string }> => {
    let route = "unmatched";
    try {
      const m = router.match(req.method, url);
      if (m.kind !== "not_found") route = m.kind === "found" ? m.route.path : m.path;
      checkAccess(req, url);
      if (m.kind === "not_found") {
        throw problem(404, "not_found", `no route for ${req.method} ${url.pathname}`);
      }
      if (m.kind === "method_not_allowed") {
        const allow = m.allow.join(", ");
        const detail = `${req.method} is not allowed on ${url.pathname}; allowed: ${allow}`;
        const doc = toProblem(
          problem(405, "method_not_allowed", detail, { allow: m.allow }),
          url.pathname,
          log,
        );
        return { res: problemResponse(doc, { allow }), route };
      }
      const ctx: RouteContext = { req, url, params: m.params, route };
      return { res: await m.route.handler(ctx), route };
    } catch (e) {
      return { res: problemResponse(toProblem(e, url.pathname, log), errorHeaders(e)), route };
    }
  };

  return async (req: Request): Promise<Response> => {
    let url: URL;
    try {
      url = new URL(req.url);
    } catch {
      return problemResponse(
        toProblem(problem(400, "bad_request", "invalid request URL"), undefined, log),
      );
    }
    const { res, route } = await respond(req, url);
    metrics.recordRequest(route, req.method, res.status);
    return req.method.toUpperCase() === "HEAD" ? await headOf(res) : res;
  };
}
