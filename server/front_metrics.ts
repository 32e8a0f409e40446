/**
 * What the device threads' front answers itself (server/device_threads.ts): a call it cannot
 * pass on (a 503 `device_thread_lost` for a lost thread's cache, a failure while routing), and
 * `/healthz`, is answered by no thread, so no thread's `/metrics` counts it; nor does any thread
 * count what the HTTP/1.1 server on the front's thread answers before the front's handler
 * (`--http-engine http1`: http1_refusals.ts). The front counts those answers here, in
 * `attn_http_requests_total` and `attn_http_problems_total`, and `/metrics` merges them
 * with the threads' series under `device_thread="front"`. Labels stay bounded: the route is a
 * known route's template or `unmatched`, never the path.
 * @module
 */
import { Metrics } from "./metrics.ts";
import { problemCodeOf } from "./problem.ts";
import { cachePath } from "./thread_http.ts";

/**
 * The handler's routes outside /v1/kv-caches/{id}: the front has no handler to ask (it runs no
 * service), so they are listed; tests/server/front_metrics_test.ts holds them to the handler's.
 */
export const FRONT_STATIC_ROUTES: ReadonlySet<string> = new Set([
  "/healthz",
  "/metrics",
  "/openapi.json",
  "/v1/kv-caches",
  "/v1/attention/forward",
  "/v1/backends",
  "/v1/backends/select",
  "/v1/device",
]);

/** The route template of `path` for a label: a known route, else `unmatched`. */
export function frontRoute(path: string): string {
  const c = cachePath(path);
  if (c) {
    return ["", "/data", "/forward"].includes(c.rest) ? `/v1/kv-caches/:id${c.rest}` : "unmatched";
  }
  return FRONT_STATIC_ROUTES.has(path) ? path : "unmatched";
}

/** The families of the front's own counts, for the merged text. */
const FAMILIES = ["attn_http_requests_total", "attn_http_problems_total"];

/** The front's own answers, counted. */
export class FrontMetrics {
  readonly #m = new Metrics();

  readonly #made = new WeakSet<Response>();

  /** Marks `res` as the front's own answer (not a problem: `/healthz`), and returns it. */
  made(res: Response): Response {
    this.#made.add(res);
    return res;
  }

  /** Counts `res` if the front made it (a problem answer built in this thread, or {@link made}). */
  record(req: Request, path: string, res: Response): void {
    const code = problemCodeOf(res);
    if (code === undefined && !this.#made.has(res)) return;
    this.#m.recordRequest(frontRoute(path), req.method, res.status, code);
  }

  /** Counts an answer given on the front's thread before its handler (Metrics.recordRequest). */
  recordRequest(route: string, method: string, status: number, code?: string): void {
    this.#m.recordRequest(route, method, status, code);
  }

  /** The request and problem families' text (their HELP and TYPE lines, then any samples). */
  render(): string {
    const keep = (line: string) => FAMILIES.some((f) => line.includes(f));
    return this.#m.render().split("\n").filter(keep).join("\n") + "\n";
  }
}
