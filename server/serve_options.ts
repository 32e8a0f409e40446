/**
 * The serve command line: `deno task serve [options]` parsed with the environment's defaults
 * (`ATTN_*` variables) into {@link ServeOptions}; `--help`'s text. Used by main.ts only (and
 * its tests). Single options are checked by serve_flag_values.ts, serve_thread_options.ts and
 * serve_keep_warm_options.ts, the flags' table is serve_flags.ts; how they combine, here.
 * @module
 */
import { resolveRuntimeOptions, runtimeEnv, type RuntimeOptions } from "../gpu/runtime_options.ts";
import { type CallLimits, DEFAULT_CALL_LIMITS } from "../service/validate.ts";
import {
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_MAX_JSON_BODY_BYTES,
  MAX_JSON_BODY_BYTES_CEILING,
} from "./body.ts";
import { INSTANCE_NAME_PATTERN } from "../wire/names.ts";
import { DEFAULT_SHUTDOWN_DEADLINE_MS } from "./shutdown.ts";
import { BODY_TIMEOUT_ENV, bodyTimeoutOption } from "./body_timeout.ts";
import type { KeepWarmOptions } from "../gpu/keep_warm.ts";
import { EnvValueError, envVar } from "../core/env.ts";
import { CHECKED_ENV } from "./serve_env.ts";
export { HELP } from "./serve_help.ts";
import {
  DEFAULT_MEMORY_BUDGET_BYTES,
  DEVICE_THREADS_ENV,
  DEVICE_THREADS_HTTP_ENV,
  HTTP_ENGINE_ENV,
  HTTP_WORKERS_ENV,
  KEEP_WARM_ENV,
} from "./serve_help.ts";
import { allowedHostsOption, intFlag, msFlag } from "./serve_flag_values.ts";
import {
  deviceThreadsHttpOption,
  type HttpEngine,
  httpEngineOption,
  threadsOption,
} from "./serve_thread_options.ts";
import { keepWarmOptions } from "./serve_keep_warm_options.ts";
import { type ServeFlags, serveFlagValues } from "./serve_flags.ts";
export type { HttpEngine };

/**
 * The environment variables serve reads (none without env permission), and those of the GPU
 * layer and the backends that main.ts checks at start-up (serve_env.ts).
 */
export function serveEnv(): Record<string, string | undefined> {
  const env = runtimeEnv();
  env[HTTP_WORKERS_ENV] = envVar(HTTP_WORKERS_ENV);
  env[HTTP_ENGINE_ENV] = envVar(HTTP_ENGINE_ENV);
  env[DEVICE_THREADS_ENV] = envVar(DEVICE_THREADS_ENV);
  env[DEVICE_THREADS_HTTP_ENV] = envVar(DEVICE_THREADS_HTTP_ENV);
  env[KEEP_WARM_ENV] = envVar(KEEP_WARM_ENV);
  env[BODY_TIMEOUT_ENV] = envVar(BODY_TIMEOUT_ENV);
  for (const name of CHECKED_ENV) env[name] = envVar(name);
  return env;
}

/** Parsed command-line options. */
export interface ServeOptions {
  port: number;
  host: string;
  maxBodyBytes: number;
  maxJsonBodyBytes: number;
  memoryBudgetBytes: number;
  limits: CallLimits;
  tokenFile?: string;
  allowUnauthenticated: boolean;
  allowedHosts: string[];
  shutdownDeadlineMs: number;
  /** The longest wait for a body's next bytes (server/body_timeout.ts `bodyTimeoutMs`). */
  bodyTimeoutMs: number;
  gpu: boolean;
  /** The HTTP server on this thread or each HTTP worker: Deno.serve or server/http1_server.ts. */
  httpEngine: HttpEngine;
  /** HTTP worker threads (0: Deno.serve on this thread). */
  httpWorkers: number;
  /** Device threads (0: this thread owns the device and the service). */
  deviceThreads: number;
  /** The device threads serve the port themselves (thread_http.ts). */
  deviceThreadsHttp: boolean;
  /** Keep-warm spins between calls (gpu/keep_warm.ts; `hold_ms` 0: off). */
  keepWarm: KeepWarmOptions;
  /** This instance's name in answers (`--instance-name`). */
  instanceName?: string;
  /** The WebGPU runtime and Dawn's flags (command line over environment). */
  runtime: RuntimeOptions;
  help: boolean;
}

/** `--port`: 0 (any free port) to 65535. */
function portOption(v: string | undefined): number {
  const port = intFlag("port", v, 8000, 0);
  if (port > 65535) throw new Error(`--port must be <= 65535, got ${port}`);
  return port;
}

/** `--max-json-body-bytes` (at most the ceiling) and `--max-body-bytes` (not below it). */
function bodyByteOptions(values: ServeFlags): { maxJson: number; maxBody: number } {
  const maxJson = intFlag(
    "max-json-body-bytes",
    values["max-json-body-bytes"],
    DEFAULT_MAX_JSON_BODY_BYTES,
    1,
  );
  if (maxJson > MAX_JSON_BODY_BYTES_CEILING) {
    throw new Error(
      `--max-json-body-bytes must be <= ${MAX_JSON_BODY_BYTES_CEILING}, got ${maxJson}; ` +
        "send bigger calls as safetensors (--max-body-bytes)",
    );
  }
  const maxBody = intFlag("max-body-bytes", values["max-body-bytes"], DEFAULT_MAX_BODY_BYTES, 1);
  if (
    values["max-json-body-bytes"] !== undefined && values["max-body-bytes"] !== undefined &&
    maxJson > maxBody
  ) {
    // JSON bodies are held to the general limit too (server/body.ts bodyLimits): the JSON one
    // would never apply, and a JSON body between the two would name --max-body-bytes.
    throw new Error(
      `--max-json-body-bytes ${maxJson} is above --max-body-bytes ${maxBody}, which caps every ` +
        "body (JSON too): lower --max-json-body-bytes or raise --max-body-bytes",
    );
  }
  return { maxJson, maxBody };
}

/** `--instance-name`, when given: wire/names.ts INSTANCE_NAME_PATTERN. */
function instanceNameOption(instanceName: string | undefined): string | undefined {
  if (instanceName !== undefined && !INSTANCE_NAME_PATTERN.test(instanceName)) {
    throw new Error(
      `--instance-name must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or ` +
        `digit, got ${JSON.stringify(instanceName)}`,
    );
  }
  return instanceName;
}

/** `--http-workers` and `--device-threads` (each over its variable), which exclude each other. */
function threadCounts(
  values: ServeFlags,
  env: Record<string, string | undefined>,
): { httpWorkers: number; deviceThreads: number } {
  const httpWorkers = threadsOption(
    "--http-workers",
    HTTP_WORKERS_ENV,
    values["http-workers"],
    env[HTTP_WORKERS_ENV],
  );
  const deviceThreads = threadsOption(
    "--device-threads",
    DEVICE_THREADS_ENV,
    values["device-threads"],
    env[DEVICE_THREADS_ENV],
  );
  if (httpWorkers > 0 && deviceThreads > 0) {
    const hw = values["http-workers"] !== undefined ? "--http-workers" : HTTP_WORKERS_ENV;
    const dt = values["device-threads"] !== undefined ? "--device-threads" : DEVICE_THREADS_ENV;
    const msg = `${hw} (${httpWorkers}) and ${dt} (${deviceThreads}) exclude each other`;
    // Both from the environment: no flag was wrong.
    throw hw === HTTP_WORKERS_ENV && dt === DEVICE_THREADS_ENV
      ? new EnvValueError(dt, String(deviceThreads), msg)
      : new Error(msg);
  }
  return { httpWorkers, deviceThreads };
}

/**
 * `--device-threads-http` and `--http-engine` (each over its variable): serving on the device
 * threads takes the `deno` engine and at least one device thread.
 */
function httpServing(
  values: ServeFlags,
  env: Record<string, string | undefined>,
  deviceThreads: number,
): { deviceThreadsHttp: boolean; httpEngine: HttpEngine } {
  const deviceThreadsHttp = deviceThreadsHttpOption(
    values["device-threads-http"],
    env[DEVICE_THREADS_HTTP_ENV],
  );
  const httpEngine = httpEngineOption(values["http-engine"], env[HTTP_ENGINE_ENV]);
  if (httpEngine !== "deno" && deviceThreadsHttp) {
    throw new Error(
      `--http-engine ${httpEngine} serves on this thread or the HTTP workers, not with ` +
        "--device-threads-http",
    );
  }
  if (deviceThreadsHttp && deviceThreads === 0) {
    const viaEnv = values["device-threads-http"] === undefined;
    const dt = values["device-threads"] !== undefined
      ? "--device-threads"
      : env[DEVICE_THREADS_ENV]
      ? DEVICE_THREADS_ENV
      : "the default";
    const msg = `${viaEnv ? `${DEVICE_THREADS_HTTP_ENV}=1` : "--device-threads-http"} needs ` +
      `--device-threads N (or ${DEVICE_THREADS_ENV}) with N >= 1, got 0 (${dt})`;
    throw viaEnv && values["device-threads"] === undefined
      ? new EnvValueError(DEVICE_THREADS_HTTP_ENV, "1", msg)
      : new Error(msg);
  }
  return { deviceThreadsHttp, httpEngine };
}

/** `--max-tokens-per-call`, `--max-attended-keys` and `--max-attention-flops`. */
function callLimitsOption(values: ServeFlags): CallLimits {
  return {
    max_tokens: intFlag(
      "max-tokens-per-call",
      values["max-tokens-per-call"],
      DEFAULT_CALL_LIMITS.max_tokens,
      1,
    ),
    max_attended_keys: intFlag(
      "max-attended-keys",
      values["max-attended-keys"],
      DEFAULT_CALL_LIMITS.max_attended_keys,
      1,
    ),
    max_attention_flops: intFlag(
      "max-attention-flops",
      values["max-attention-flops"],
      DEFAULT_CALL_LIMITS.max_attention_flops,
      1,
    ),
  };
}

/**
 * Parses the command line; `env` supplies ATTN_WEBGPU_RUNTIME / ATTN_DAWN_FLAGS.
 * @throws Error with a usage message on bad flags.
 */
export function parseServeArgs(
  args: string[],
  env: Record<string, string | undefined> = {},
): ServeOptions {
  const values = serveFlagValues(args);
  // The checks run in this order (the first bad flag names the error), the object's below too.
  const port = portOption(values.port);
  const { maxJson, maxBody } = bodyByteOptions(values);
  const tokenFile = values["token-file"];
  const instanceName = instanceNameOption(values["instance-name"]);
  const { httpWorkers, deviceThreads } = threadCounts(values, env);
  const { deviceThreadsHttp, httpEngine } = httpServing(values, env, deviceThreads);
  return {
    port,
    host: values.host ?? "127.0.0.1",
    maxBodyBytes: maxBody,
    maxJsonBodyBytes: maxJson,
    memoryBudgetBytes: intFlag(
      "memory-budget-bytes",
      values["memory-budget-bytes"],
      DEFAULT_MEMORY_BUDGET_BYTES,
      0,
    ),
    limits: callLimitsOption(values),
    ...(tokenFile !== undefined ? { tokenFile } : {}),
    allowUnauthenticated: values["allow-unauthenticated"] ?? false,
    allowedHosts: allowedHostsOption(values["allowed-host"]),
    shutdownDeadlineMs: msFlag(
      "shutdown-deadline-ms",
      values["shutdown-deadline-ms"],
      DEFAULT_SHUTDOWN_DEADLINE_MS,
      0,
    ),
    bodyTimeoutMs: bodyTimeoutOption(values["body-timeout-ms"], env[BODY_TIMEOUT_ENV]),
    gpu: !values["no-gpu"],
    httpEngine,
    httpWorkers,
    deviceThreads,
    deviceThreadsHttp,
    keepWarm: keepWarmOptions(values, env[KEEP_WARM_ENV]),
    ...(instanceName !== undefined ? { instanceName } : {}),
    runtime: resolveRuntimeOptions({
      runtime: values["webgpu-runtime"],
      dawnFlags: values["dawn-flags"],
      dawnFlag: values["dawn-flag"],
    }, env),
    help: values.help ?? false,
  };
}
