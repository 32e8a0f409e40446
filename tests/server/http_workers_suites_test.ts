/**
 * The forward, error, contract-edge, limit, auth, shutdown, cache-route, cache-data and
 * queue-timeout suites again, each server behind two HTTP worker threads (server/worker_front.ts;
 * process-level servers with `--http-workers 2`): what a client sees must not depend on the front.
 */
import "./forward_test.ts";
import "./errors_test.ts";
import "./contract_edges_test.ts";
import "./limits_test.ts";
import "./auth_test.ts";
import "./shutdown_test.ts";
import "./cache_routes_test.ts";
import "./cache_data_test.ts";
import "./queue_timeout_http_test.ts";
import { serverMode } from "./helpers.ts";

serverMode.httpWorkers = 2;
