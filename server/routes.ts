/**
 * The route table: method + URLPattern → handler. A path that matches no route is a 404
 * `not_found`; a path that matches with another method is a 405 `method_not_allowed` with an
 * `Allow` header listing the methods it does take. HEAD matches every GET route (the handler
 * drops the body).
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
  pattern: URLPattern;
  handler: RouteHandler;
}

/** The outcome of matching a request. */
export type RouteMatch =
  | { kind: "found"; route: Route; params: Record<string, string> }
  | { kind: "method_not_allowed"; path: string; allow: string[] }
  | { kind: "not_found" };

/** An ordered route table. */
export class Router {
  readonly routes: Route[] = [];

  /** Adds a route; `path` is a URLPattern pathname like `/v1/kv-caches/:id`. */
  add(method: string, path: string, handler: RouteHandler): this {
    this.routes.push({
      method: method.toUpperCase(),
      path,
      pattern: new URLPattern({ pathname: path }),
      handler,
    });
    return this;
  }

  /** Finds the route of a method and URL (HEAD finds the GET route). */
  match(method: string, url: URL): RouteMatch {
    const want = method.toUpperCase() === "HEAD" ? "GET" : method.toUpperCase();
    const allow: string[] = [];
    let path = "";
    for (const r of this.routes) {
      const m = r.pattern.exec({ pathname: url.pathname });
      if (!m) continue;
      const params: Record<string, string> = {};
      for (const [k, v] of Object.entries(m.pathname.groups)) if (v !== undefined) params[k] = v;
      if (r.method === want) return { kind: "found", route: r, params };
      for (const a of r.method === "GET" ? ["GET", "HEAD"] : [r.method]) {
        if (!allow.includes(a)) allow.push(a);
      }
      path = r.path;
    }
    return allow.length ? { kind: "method_not_allowed", path, allow } : { kind: "not_found" };
  }
}
