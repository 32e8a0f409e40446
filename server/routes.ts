/**
 * The route table: method + path template → handler. A template is `/`-separated segments,
 * each a literal or a `:name` parameter that matches one non-empty segment (as URLPattern's
 * `:name` does; matched by comparing segments, which costs a few microseconds where URLPattern
 * took 30-60 per request). A path that matches no route is a 404 `not_found`; a path that
 * matches with another method is a 405 `method_not_allowed` with an `Allow` header listing
 * the methods it does take. HEAD matches every GET route (the handler drops the body).
 * @module
 */

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

  /** Finds the route of a method and URL (HEAD finds the GET route). */
  match(method: string, url: URL): RouteMatch {
    const want = method.toUpperCase() === "HEAD" ? "GET" : method.toUpperCase();
    const allow: string[] = [];
    let path = "";
    const segments = url.pathname.split("/");
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
