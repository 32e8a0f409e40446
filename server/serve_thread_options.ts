/**
 * The serve options that lay out threads and choose the HTTP server, each a flag over its
 * environment variable over its default: `--http-workers`, `--device-threads`,
 * `--device-threads-http` and `--http-engine` (serve_options.ts `parseServeArgs` checks how
 * they combine).
 * @module
 */
import { EnvValueError, parseVariable } from "../core/env.ts";
import {
  DEFAULT_HTTP_WORKERS,
  DEVICE_THREADS_HTTP_ENV,
  HTTP_ENGINE_ENV,
  HTTP_ENGINES,
  MAX_HTTP_WORKERS,
} from "./serve_help.ts";

/** `--http-workers` / `--device-threads` (over the environment variable, over the default). */
export function threadsOption(
  flagName: string,
  envName: string,
  flag: string | undefined,
  env: string | undefined,
): number {
  const count = (name: string, v: string) => {
    if (!/^\d+$/.test(v) || Number(v) > MAX_HTTP_WORKERS) {
      throw new Error(
        `${name} must be an integer from 0 to ${MAX_HTTP_WORKERS}, got ${JSON.stringify(v)}`,
      );
    }
    return Number(v);
  };
  if (flag !== undefined) return count(flagName, flag);
  if (env === undefined || env === "") return DEFAULT_HTTP_WORKERS;
  return parseVariable(envName, env, () => count(envName, env));
}

/** `--device-threads-http` (the flag, else the environment variable: `1` or `0`). */
export function deviceThreadsHttpOption(
  flag: boolean | undefined,
  env: string | undefined,
): boolean {
  if (flag !== undefined) return flag;
  if (env === undefined || env === "") return false;
  if (env !== "0" && env !== "1") {
    throw new EnvValueError(
      DEVICE_THREADS_HTTP_ENV,
      env,
      `${DEVICE_THREADS_HTTP_ENV} must be 0 or 1, got ${JSON.stringify(env)}`,
    );
  }
  return env === "1";
}

/** An HTTP server `--http-engine` names. */
export type HttpEngine = typeof HTTP_ENGINES[number];

/** `--http-engine` over ATTN_HTTP_ENGINE over `deno`. */
export function httpEngineOption(flag: string | undefined, env: string | undefined): HttpEngine {
  const v = flag ?? (env === "" ? undefined : env) ?? "deno";
  if ((HTTP_ENGINES as readonly string[]).includes(v)) return v as HttpEngine;
  const msg = `must be one of ${HTTP_ENGINES.join(", ")}, got ${JSON.stringify(v)}`;
  if (flag !== undefined) throw new Error(`--http-engine ${msg}`);
  throw new EnvValueError(HTTP_ENGINE_ENV, v, `${HTTP_ENGINE_ENV} ${msg}`);
}
