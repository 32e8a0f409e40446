/**
 * The forward, error, contract-edge, limit, auth, shutdown, cache-route, cache-data, queue-timeout
 * and body timeout suites and the body release suite (pooled bodies reused between calls) again,
 * each server on the service's own HTTP/1.1 server (server/http1_server.ts; process-level servers
 * with `--http-engine http1`): what a client sees must not depend on the HTTP server, but for what
 * http1_protocol_test.ts pins (malformed heads answered as problems).
 */
import assert from "node:assert/strict";
import "./forward_test.ts";
import "./errors_test.ts";
import "./contract_edges_test.ts";
import "./limits_test.ts";
import "./auth_test.ts";
import "./shutdown_test.ts";
import "./cache_routes_test.ts";
import "./cache_data_test.ts";
import "./queue_timeout_http_test.ts";
import "./body_timeout_test.ts";
import "./body_release_test.ts";
import { serverMode } from "./helpers.ts";

serverMode.engine = "http1";

Deno.test("http1 suites: the servers above are the service's own (a lowercase method is a 501)", async () => {
  const { startServer } = await import("./helpers.ts");
  const { rawExchange } = await import("./raw_http.ts");
  const srv = await startServer();
  try {
    const r = await rawExchange(srv.port, "get /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
    assert.equal(r?.status, 501, "served by Deno.serve, not http1_server.ts");
  } finally {
    await srv.close();
  }
});
