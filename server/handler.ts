/**
 * The HTTP handler: `createHandler(service, opts)` returns a pure `(Request) => Promise<Response>`
 * (no Deno.serve here) implementing every endpoint of the contract over one route table (the
 * cache routes in cache_routes.ts, the forward routes in forward_routes.ts). Errors are RFC 9457
 * problems; the handler never throws. The access check (token, Host) runs before routing;
 * HEAD answers a GET route's status and headers without its body; a forward call gets the
 * request's AbortSignal (aborted when the client goes away).
 * @module
 */
import type { AttentionService } from "../service/service.ts";
import { INSTANCE_HEADER } from "../wire/names.ts";
import { SelectRequestSchema } from "../wire/schemas.ts";
import { accessCheck, type AccessPolicy } from "./auth.ts";
import { bodyLimits, jsonBody } from "./body.ts";
import { addCacheRoutes } from "./cache_routes.ts";
import { addForwardRoutes } from "./forward_routes.ts";
import { type JsonDecoder, sharedJsonDecoder } from "./json_decoder.ts";
import { Metrics, METRICS_CONTENT_TYPE } from "./metrics.ts";
import { openApiDocument } from "./openapi.ts";
import {
  errorHeaders,
  type ErrorLogger,
  problem,
  problemCodeOf,
  problemResponse,
  toProblem,
} from "./problem.ts";
import { headOf, healthDocument, jsonResponse } from "./responses.ts";
import { badUrlProblem, requestUrl, type RouteContext, Router, sentPath } from "./routes.ts";

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
  /**
   * This instance's name: sent in the `X-Attention-Instance` header of every answer and in
   * `/healthz` (default none: no header).
   */
  instance?: string;
  /** Decodes JSON forward bodies (big ones in a worker); default the process-wide one. */
  jsonDecoder?: JsonDecoder;
  /**
   * Requests this says are not a client's are answered but not counted in the request metrics
   * (the device threads' front asks every thread for its series; one scrape counts once).
   */
  uncounted?: (req: Request, res: Response) => boolean;
  /**
   * Requests this says are the front's own (its scrape of a thread's series) are not in
   * `attn_http_requests_in_flight` either: one scrape over N threads counted itself N times.
   */
  notInFlight?: (req: Request) => boolean;
}

/**
 * A request handler, the route table it serves (method and URLPattern path of each), and where
 * it counts (for what a server answers before it: worker_front.ts serveHttp's `metrics`).
 */
export type Handler = ((req: Request) => Promise<Response>) & {
  readonly routes: readonly { method: string; path: string }[];
  readonly metrics: Metrics;
};

/** Builds the request handler for a service. */
export function createHandler(service: AttentionService, opts: HandlerOptions = {}): Handler {
  const limits = bodyLimits(opts.maxBodyBytes, opts.maxJsonBodyBytes);
  const checkAccess = accessCheck(opts.access ?? {});
  const metrics = opts.metrics ?? new Metrics({
    cacheBytes: () => service.caches.usedBytes,
    cacheCount: () => service.caches.list().length,
    cacheBudgetBytes: () => service.caches.budgetBytes,
    planCache: () => service.plans.stats(),
  });
  const log = opts.log;
  const instance = opts.instance;
  const router = new Router();

  const health = healthDocument(instance);
  router.add("GET", "/healthz", () => jsonResponse(health));
  router.add("GET", "/v1/device", () => jsonResponse(service.deviceReport()));
  router.add("GET", "/v1/backends", () => jsonResponse({ backends: service.backends() }));
  router.add("POST", "/v1/backends/select", async ({ req }) => {
    const { backend, ...cfg } = await jsonBody(req, limits, SelectRequestSchema);
    return jsonResponse(service.select(cfg, backend));
  });
  addCacheRoutes(router, service, limits);
  addForwardRoutes(router, service, limits, metrics, opts.jsonDecoder ?? sharedJsonDecoder);
  router.add(
    "GET",
    "/metrics",
    () =>
      new Response(metrics.render(), {
        headers: { "content-type": METRICS_CONTENT_TYPE },
      }),
  );
  router.add("GET", "/openapi.json", () => jsonResponse(openApiDocument()));

  const respond = async (
    req: Request,
    url: URL,
    path: string,
  ): Promise<{ res: Response; route: string }> => {
    let route = "unmatched";
    try {
      const m = router.match(req.method, path);
      if (m.kind !== "not_found") route = m.kind === "found" ? m.route.path : m.path;
      checkAccess(req);
      if (m.kind === "not_found") {
        throw problem(404, "not_found", `no route for ${req.method} ${path}`);
      }
      if (m.kind === "method_not_allowed") {
        const allow = m.allow.join(", ");
        const detail = `${req.method} is not allowed on ${path}; allowed: ${allow}`;
        const doc = toProblem(
          problem(405, "method_not_allowed", detail, { allow: m.allow }),
          path,
          log,
        );
        return { res: problemResponse(doc, { allow }), route };
      }
      const ctx: RouteContext = { req, url, params: m.params, route };
      return { res: await m.route.handler(ctx), route };
    } catch (e) {
      return { res: problemResponse(toProblem(e, path, log), errorHeaders(e)), route };
    }
  };

  // Deno builds the URL from the Host header: one it cannot parse ("[", "a b", a port over
  // 65535) makes no URL, so no route; answered 400 and counted like any other answer.
  const badUrl = (req: Request): { res: Response; route: string } => ({
    res: problemResponse(toProblem(badUrlProblem(req), undefined, log)),
    route: "unmatched",
  });
  const handle = async (req: Request): Promise<Response> => {
    const url = requestUrl(req);
    const inFlight = !opts.notInFlight?.(req);
    if (inFlight) metrics.requestStarted();
    let answered: { res: Response; route: string };
    try {
      answered = url ? await respond(req, url, sentPath(req)) : badUrl(req);
    } finally {
      if (inFlight) metrics.requestEnded();
    }
    const { res, route } = answered;
    if (!opts.uncounted?.(req, res)) {
      metrics.recordRequest(route, req.method, res.status, problemCodeOf(res));
    }
    if (instance !== undefined) res.headers.set(INSTANCE_HEADER, instance);
    return req.method.toUpperCase() === "HEAD" ? await headOf(res) : res;
  };
  const routes = router.routes.map(({ method, path }) => ({ method, path }));
  return Object.assign(handle, { routes, metrics });
}
