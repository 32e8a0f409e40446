/**
 * The route table matches paths by segments the way URLPattern's `:name` does (the router
 * used URLPattern before; segment matching costs microseconds where URLPattern took 30-60 per
 * request): a differential check against URLPattern over the service's templates and paths
 * built to probe the edges (trailing and doubled slashes, empty parameters, percent-encoding,
 * case, dots), then the table's 404 / 405 / HEAD answers.
 */
import assert from "node:assert/strict";
import { matchSegments, requestPath, Router } from "../../server/routes.ts";
import { Rng } from "../support/rng.ts";

const TEMPLATES = [
  "/healthz",
  "/v1/device",
  "/v1/backends",
  "/v1/backends/select",
  "/v1/kv-caches",
  "/v1/kv-caches/:id",
  "/v1/kv-caches/:id/data",
  "/v1/kv-caches/:id/forward",
  "/v1/attention/forward",
  "/metrics",
  "/openapi.json",
];

const PIECES = [
  "",
  "v1",
  "V1",
  "kv-caches",
  "kv-caches ",
  "attention",
  "forward",
  "data",
  "healthz",
  "metrics",
  "openapi.json",
  "abc",
  "a%2Fb",
  "%20",
  "..",
  ".",
  "ID_9",
  "select",
  "backends",
  "device",
  ":id",
];

const PATTERNS = new Map(TEMPLATES.map((t) => [t, new URLPattern({ pathname: t })]));

/** URLPattern's verdict: the params, or null. */
function viaUrlPattern(template: string, pathname: string): Record<string, string> | null {
  const m = PATTERNS.get(template)!.exec({ pathname });
  if (!m) return null;
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(m.pathname.groups)) if (v !== undefined) out[k] = v;
  return out;
}

Deno.test("routes: segment matching agrees with URLPattern on every probe path", () => {
  const rng = new Rng(7);
  const paths = new Set<string>(["/", "//", "/v1/kv-caches/", "/v1/kv-caches//forward"]);
  for (const t of TEMPLATES) {
    paths.add(t);
    paths.add(t + "/");
    paths.add(t.replace(":id", "c1"));
    paths.add(t.replace(":id", "a%2Fb") + "/");
    // Each segment swapped for each piece: near misses and parameter values.
    const segs = t.split("/");
    for (let i = 1; i < segs.length; i++) {
      for (const piece of PIECES) paths.add(segs.map((x, j) => j === i ? piece : x).join("/"));
    }
  }
  while (paths.size < 2000) {
    const n = 1 + rng.int(4);
    paths.add("/" + Array.from({ length: n }, () => PIECES[rng.int(PIECES.length)]).join("/"));
  }
  let matched = 0;
  for (const raw of paths) {
    // As the handler sees it: the pathname of a parsed URL.
    const pathname = new URL(`http://x${raw}`).pathname;
    for (const t of TEMPLATES) {
      const want = viaUrlPattern(t, pathname);
      const got = matchSegments(t.split("/"), pathname.split("/"));
      assert.deepEqual(got, want, `${t} on ${JSON.stringify(pathname)}`);
      if (want) matched++;
    }
  }
  assert.ok(matched > 60, `the probes hit routes (${matched} matches)`);
});

Deno.test("routes: found, 405 with the allowed methods, 404, HEAD on GET routes", () => {
  const r = new Router();
  const h = () => new Response();
  r.add("GET", "/v1/kv-caches/:id", h).add("DELETE", "/v1/kv-caches/:id", h);
  r.add("POST", "/v1/kv-caches/:id/forward", h);
  const url = (p: string) => requestPath(`http://x${p}`);
  const found = r.match("DELETE", url("/v1/kv-caches/c1"));
  assert.equal(found.kind, "found");
  assert.deepEqual(found.kind === "found" && found.params, { id: "c1" });
  const head = r.match("head", url("/v1/kv-caches/c1"));
  assert.equal(head.kind === "found" && head.route.method, "GET");
  assert.deepEqual(r.match("PUT", url("/v1/kv-caches/c1")), {
    kind: "method_not_allowed",
    path: "/v1/kv-caches/:id",
    allow: ["GET", "HEAD", "DELETE"],
  });
  assert.deepEqual(r.match("GET", url("/v1/kv-caches/c1/forward/")), { kind: "not_found" });
  assert.throws(() => r.add("GET", "/v1//x", h), /empty segment/);
  assert.throws(() => r.add("GET", "/v1/:", h), /parameter name/);
});

Deno.test("routes: requestPath keeps the path as sent, dot segments and escapes included", () => {
  const cases: [string, string][] = [
    ["http://h:1/v1/kv-caches/%2e%2e", "/v1/kv-caches/%2e%2e"],
    ["http://h/v1/kv-caches/./x?a=/../b", "/v1/kv-caches/./x"],
    ["http://h/a/../b#frag/..", "/a/../b"],
    ["http://h/a#f?q", "/a"],
    ["http://h", "/"],
    ["http://h?q=1", "/"],
    ["http://h?q=/x", "/"],
    ["http://h#/x", "/"],
    ["/already/a/path", "/already/a/path"],
  ];
  for (const [href, want] of cases) assert.equal(requestPath(href), want, href);
});
