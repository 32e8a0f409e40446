/**
 * Whether a route will refuse a request by its head alone (415 for its Content-Type or
 * Content-Encoding, 406 for its Accept, 413 for a declared length over the body kind's limit),
 * so that a thread that passes requests on (request_sender.ts: the device-threads front, which
 * reads a forward's body to find its cache) does not read a body no route would read. The checks
 * are the routes' own (server/body.ts), in their order; a request this does not recognise is
 * read as before, so a miss costs the read and never changes an answer.
 * @module
 */
import { accessAllowed, type AccessPolicy } from "./auth.ts";
import { answerKind, type BodyKind, bodyKind, type BodyLimits } from "./body.ts";
import { contentLength } from "./body_read.ts";
import { matchSegments, sentPath } from "./routes.ts";

/** A route that reads a body: the kinds it takes, and whether it negotiates its answer. */
interface BodyRoute {
  method: string;
  path: string;
  kinds: BodyKind[];
  negotiates: boolean;
}

/** The routes that read a body (server/forward_routes.ts, cache_routes.ts, handler.ts). */
export const BODY_ROUTES: readonly (BodyRoute & { segments: string[] })[] = ([
  { method: "POST", path: "/v1/attention/forward", kinds: ["json", "binary"], negotiates: true },
  {
    method: "POST",
    path: "/v1/kv-caches/:id/forward",
    kinds: ["json", "binary"],
    negotiates: true,
  },
  { method: "POST", path: "/v1/kv-caches", kinds: ["json"], negotiates: false },
  { method: "PUT", path: "/v1/kv-caches/:id", kinds: ["json"], negotiates: false },
  { method: "PUT", path: "/v1/kv-caches/:id/data", kinds: ["binary"], negotiates: false },
  { method: "POST", path: "/v1/backends/select", kinds: ["json"], negotiates: false },
] as BodyRoute[]).map((r) => ({ ...r, segments: r.path.split("/") }));

/** True when `req`'s route refuses it by its head alone (see the module doc). */
export function refusedByHead(req: Request, limits: BodyLimits): boolean {
  const method = req.method.toUpperCase();
  const path = sentPath(req).split("/");
  const route = BODY_ROUTES.find((r) =>
    r.method === method && matchSegments(r.segments, path) !== null
  );
  if (!route) return false;
  try {
    if (route.negotiates) answerKind(req);
    const kind = bodyKind(req, route.kinds);
    return contentLength(req.headers.get("content-length")) > limits[kind].bytes;
  } catch {
    return true; // the route's own check throws the same 415 / 406
  }
}

/**
 * What a thread that passes requests on reads the body of: a request `access` allows (auth.ts
 * accessAllowed) that its route does not refuse by its head ({@link refusedByHead}).
 */
export function bodyReader(access: AccessPolicy, limits: BodyLimits): (req: Request) => boolean {
  const allowed = accessAllowed(access);
  return (req) => allowed(req) && !refusedByHead(req, limits);
}
