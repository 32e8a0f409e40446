/**
 * A Host header no URL can be built from ("[", "a b", a port over 65535) is a 400 `bad_request`
 * naming it, counted in /metrics, in every serving mode. With HTTP workers or device threads (with
 * and without thread listeners) it was a 500: the Request rebuilt on another thread threw; and the
 * device-threads front answered /healthz 200
 * (a docs-against-service audit, session 35). tests/server/auth_test.ts covers one thread and
 * (under ATTN_TEST_HTTP_WORKERS) the workers in process; this file the spawned modes.
 * @module
 */
import assert from "node:assert/strict";
import { spawnServer } from "./process.ts";
import { rawExchange, rawRequest } from "./raw_http.ts";

const MODES = [
  ["--device-threads", "2"],
  ["--device-threads", "2", "--device-threads-http"],
  ["--http-workers", "1"],
];

const CALLS: [string, string, string][] = [
  ["GET", "/healthz", "["],
  ["POST", "/v1/attention/forward", "a b"],
  ["PUT", "/v1/kv-caches/c1", "localhost:99999"],
  ["GET", "/metrics", "[::1"],
];

for (const mode of MODES) {
  Deno.test(`${mode.join(" ")}: a Host no URL can be built from is a 400 naming it`, async () => {
    const srv = await spawnServer(["--no-gpu", ...mode]);
    try {
      for (const [method, path, host] of CALLS) {
        const r = await rawExchange(
          srv.port,
          rawRequest(method, path, { host, "content-type": "application/json" }, "{}"),
        );
        assert.equal(r?.status, 400, `${method} ${path} (Host ${host}): ${r?.text}`);
        const doc = JSON.parse(r!.text);
        assert.equal(doc.code, "bad_request");
        assert.equal(doc.host, host);
      }
      const m = await (await fetch(`${srv.url}/metrics`)).text();
      const counted = [
        ...m.matchAll(/^attn_http_problems_total\{[^}]*code="bad_request"[^}]*\} (\d+)$/gm),
      ]
        .reduce((n, x) => n + Number(x[1]), 0);
      assert.equal(counted, CALLS.length, m);
      assert.doesNotMatch(srv.stderr(), /unexpected|internal_error/i);
    } finally {
      srv.kill("SIGTERM");
      await srv.exited;
    }
  });
}
