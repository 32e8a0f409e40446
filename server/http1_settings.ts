/**
 * The settings of the service's own HTTP/1.1 server (http1_server.ts) read from the environment:
 * the time a connection may wait idle or for a head, and the connections open at once.
 * @module
 */
import { envInt, type EnvSetting } from "../core/env.ts";
import { MAX_TIMER_MS } from "../core/timeout.ts";

/** ms a connection may wait for the first byte of its next request (default 120 s). */
export const IDLE_TIMEOUT_SETTING: EnvSetting<number> = {
  name: "ATTN_HTTP_IDLE_TIMEOUT_MS",
  unset: 120_000,
  parse: (t) => envInt("ATTN_HTTP_IDLE_TIMEOUT_MS", t, 1, MAX_TIMER_MS, " (ms)"),
};
/** ms a request head may take once its first byte came (default 30 s; a 408 after). */
export const HEAD_TIMEOUT_SETTING: EnvSetting<number> = {
  name: "ATTN_HTTP_HEAD_TIMEOUT_MS",
  unset: 30_000,
  parse: (t) => envInt("ATTN_HTTP_HEAD_TIMEOUT_MS", t, 1, MAX_TIMER_MS, " (ms)"),
};
/** Connections open at once (default 4096). */
export const MAX_CONNECTIONS_SETTING: EnvSetting<number> = {
  name: "ATTN_HTTP_MAX_CONNECTIONS",
  unset: 4096,
  parse: (t) => envInt("ATTN_HTTP_MAX_CONNECTIONS", t, 1, 1_000_000),
};
