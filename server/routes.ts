/**
 * The route table: method + path template → handler. A template is `/`-separated segments,
 * each a literal or a `:name` parameter that matches one non-empty segment (as URLPattern's
 * `:name` does; matched by comparing segments, which costs a few microseconds where URLPattern
 * took 30-60 per request). A path that matches no route is a 404 `not_found`; a path that
 * matches with another method is a 405 `method_not_allowed` with an `Allow` header listing
 * the methods it does take. HEAD matches every GET route (the handler drops the body). Routes
 * match the request target's path as sent ({@link requestPath}): `.` and `..` segments, plain or
 * percent-encoded, are never resolved, so `/v1/kv-caches/%2e%2e` reaches the cache routes (whose
 * id check refuses it) instead of turning into `/v1/`.
 * @module
 */
import type { ServiceError } from "../core/errors.ts";
import { problem } from "./problem.ts";

/** What a route handler receives. */
export interface RouteContext {
  req: Request;
  url: URL;
  params: Record<string, string>;
  /** The route's template, e.g. `/v1/kv-caches/:id` (a metrics label). */
  route: string;
}

/** A route handler. */
export type RouteHandler = (ctx: RouteContext) => Promise<Response> | Response;

/** One route. */
export interface Route {
  method: string;
  path: string;
  /** The template's segments: a literal, or a parameter's name after `:`. */
  segments: string[];
  handler: RouteHandler;
}

/**
 * The parameters of `path` (split at `/`) under a template's segments, or null when it does
 * not match: same number of segments, literals equal, parameters non-empty.
 */
export function matchSegments(
  segments: readonly string[],
  path: readonly string[],
): Record<string, string> | null {
  if (segments.length !== path.length) return null;
  let params: Record<string, string> | null = null;
  for (let i = 0; i < segments.length; i++) {
    const want = segments[i], got = path[i];
    if (want.startsWith(":")) {
      if (got === "") return null;
      (params ??= {})[want.slice(1)] = got;
    } else if (want !== got) return null;
  }
  return params ?? {};
}

/**
 * The path of a request URL as the client sent it: between the authority and any `?` or `#`,
 * with no dot segment resolved (`new URL` resolves them, `%2e` included; Deno's `Request.url`
 * keeps the target as sent).
 */
export function requestPath(href: string): string {
  const scheme = href.indexOf("://");
  let start = scheme < 0 ? 0 : scheme + 3;
  if (scheme >= 0) {
    while (start < href.length && !"/?#".includes(href[start])) start++;
  }
  let end = start;
  while (end < href.length && href[end] !== "?" && href[end] !== "#") end++;
  return end > start ? href.slice(start, end) : "/";
}

const sentPaths = new WeakMap<Request, string>();
const sentUrls = new WeakMap<Request, string>();

/**
 * Records the path a request was sent with (`sent`: its request target, or a URL), for a
 * Request rebuilt on another thread (server/request_owner.ts) or by the service's own HTTP/1.1
 * server: `new Request(url)` resolves dot segments, so the rebuilt one's `url` no longer says
 * what the client sent. The URL it was built from (`url`, else an absolute `sent`) is kept
 * too, for {@link urlAsSent}.
 */
export function keepSentPath(req: Request, sent: string, url?: string): void {
  sentPaths.set(req, requestPath(sent));
  const whole = url ?? (sent.includes("://") ? sent : undefined);
  if (whole !== undefined) sentUrls.set(req, whole);
}

/**
 * The URL to pass a request on to another thread with: as the client sent it (see
 * {@link keepSentPath}), else `req.url`. Passing `req.url` of a rebuilt Request sent its
 * resolved path: `/v1/kv-caches/x/../victim` reached the thread as `/v1/kv-caches/victim`
 * (device threads), where one thread answers 404 (docs/api.md: paths are matched as sent).
 */
export function urlAsSent(req: Request): string {
  return sentUrls.get(req) ?? req.url;
}

const unparsable = new WeakSet<Request>();

/**
 * Marks a Request rebuilt on another thread (server/request_owner.ts) whose sent URL no Request
 * takes (a Host header that is no URL authority: "[", "a b", a port over 65535), so that it was
 * built on a placeholder URL: {@link requestUrl} says null for it, as for the original.
 */
export function markUnparsableUrl(req: Request): void {
  unparsable.add(req);
}

/** The 400 a request gets whose URL cannot be built (see {@link requestUrl}), naming its Host. */
export function badUrlProblem(req: Request): ServiceError {
  const host = req.headers.get("host");
  return problem(400, "bad_request", `request URL not valid (Host: ${JSON.stringify(host)})`, {
    host,
  });
}

/** The request's URL, or null where none can be built from what the client sent. */
export function requestUrl(req: Request): URL | null {
  if (unparsable.has(req)) return null;
  try {
    return new URL(req.url);
  } catch {
    return null;
  }
}

/** The path a request was sent with: {@link keepSentPath}'s, else {@link requestPath}'s. */
export function sentPath(req: Request): string {
  return sentPaths.get(req) ?? requestPath(req.url);
}

/** The outcome of matching a request. */
export type RouteMatch =
  | { kind: "found"; route: Route; params: Record<string, string> }
  | { kind: "method_not_allowed"; path: string; allow: string[] }
  | { kind: "not_found" };

/** An ordered route table. */
export class Router {
  readonly routes: Route[] = [];

  /** Adds a route; `path` is a template like `/v1/kv-caches/:id`. */
  add(method: string, path: string, handler: RouteHandler): this {
    const segments = path.split("/");
    if (!path.startsWith("/") || segments.some((x, i) => i > 0 && (x === "" || x === ":"))) {
      throw new Error(`route template ${JSON.stringify(path)}: empty segment or parameter name`);
    }
    this.routes.push({ method: method.toUpperCase(), path, segments, handler });
    return this;
  }

  /** Finds the route of a method and a path ({@link requestPath}; HEAD finds the GET route). */
  match(method: string, pathname: string): RouteMatch {
    const want = method.toUpperCase() === "HEAD" ? "GET" : method.toUpperCase();
    const allow: string[] = [];
    let path = "";
    const segments = pathname.split("/");
    for (const r of this.routes) {
      const params = matchSegments(r.segments, segments);
      if (params === null) continue;
      if (r.method === want) return { kind: "found", route: r, params };
      for (const a of r.method === "GET" ? ["GET", "HEAD"] : [r.method]) {
        if (!allow.includes(a)) allow.push(a);
      }
      path = r.path;
    }
    return allow.length ? { kind: "method_not_allowed", path, allow } : { kind: "not_found" };
  }
}
