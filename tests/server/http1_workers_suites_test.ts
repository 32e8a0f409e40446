/**
 * The forward, error, limit, shutdown, cache-route and cache-data suites again, each server's
 * HTTP/1.1 server (server/http1_server.ts) run by two HTTP worker threads (server/worker_front.ts;
 * process-level servers with `--http-engine http1 --http-workers 2`): what a client sees must not
 * depend on which threads serve it. Then what the workers share: the answers http1 gives itself
 * counted in the owner's `/metrics`, and ATTN_HTTP_MAX_CONNECTIONS capping the port, not each
 * worker.
 */
import assert from "node:assert/strict";
import "./forward_test.ts";
import "./errors_test.ts";
import "./limits_test.ts";
import "./shutdown_test.ts";
import "./cache_routes_test.ts";
import "./cache_data_test.ts";
import { serverMode, startServer } from "./helpers.ts";
import { answerOn, RAW_GET, rawExchange } from "./raw_http.ts";
import { withEnv } from "../support/env.ts";

serverMode.engine = "http1";
serverMode.httpWorkers = 2;

const unmatched = async (port: number) => {
  const m = await rawExchange(port, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
  assert.equal(m?.status, 200, m?.text);
  return m!.text.split("\n").filter((l) => l.includes('route="unmatched"')).sort();
};

Deno.test("http1 workers: http1 serves, its own answers counted on the owner's thread", async () => {
  const srv = await startServer();
  try {
    assert.deepEqual(await unmatched(srv.port), [], "none before");
    // http1_server.ts answers these itself (Deno.serve would not answer a lowercase method 501).
    const r = await rawExchange(srv.port, "get /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
    assert.equal(r?.status, 501, "served by Deno.serve, not http1_server.ts");
    const v = await rawExchange(srv.port, "GET /healthz HTTP/9.9\r\nhost: x\r\n\r\n");
    assert.equal(v?.status, 505, v?.text);
    assert.deepEqual(await unmatched(srv.port), [
      'attn_http_problems_total{route="unmatched",status="501",code="method_not_implemented"} 1',
      'attn_http_problems_total{route="unmatched",status="505",code="http_version_not_supported"} 1',
      'attn_http_requests_total{route="unmatched",method="GET",status="505"} 1',
      'attn_http_requests_total{route="unmatched",method="other",status="501"} 1',
    ]);
  } finally {
    await srv.close();
  }
});

Deno.test("http1 workers: ATTN_HTTP_MAX_CONNECTIONS caps the port, not each worker", async () => {
  await withEnv({ ATTN_HTTP_MAX_CONNECTIONS: "2" }, async () => {
    const srv = await startServer();
    const conns: Deno.Conn[] = [];
    try {
      // Eight connections kept open, each asked once: the kernel spreads them over both workers
      // (reusePort), so capped per worker up to four would be served.
      const statuses: number[] = [];
      for (let i = 0; i < 8; i++) {
        const c = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
        conns.push(c);
        await c.write(new TextEncoder().encode(`${RAW_GET}\r\n`));
        statuses.push((await answerOn(c)).status);
      }
      assert.deepEqual(statuses.filter((s) => s === 200).length, 2, `${statuses}`);
      assert.deepEqual(statuses.filter((s) => s === 503).length, 6, `${statuses}`);
      conns.forEach((c) => c.close());
      conns.length = 0;
      // Closed ones give their places back: two more are served.
      await new Promise((r) => setTimeout(r, 100));
      for (let i = 0; i < 2; i++) {
        const r = await rawExchange(srv.port, `${RAW_GET}\r\n`);
        assert.equal(r?.status, 200, r?.text);
      }
    } finally {
      conns.forEach((c) => c.close());
      await srv.close();
    }
  });
});
