/**
 * The serve command line: `deno task serve [options]` parsed with the environment's defaults
 * (`ATTN_*` variables) into {@link ServeOptions}; `--help`'s text. Used by main.ts only (and
 * its tests).
 * @module
 */
import { parseArgs } from "node:util";
import {
  resolveRuntimeOptions,
  RUNTIME_HELP,
  runtimeEnv,
  type RuntimeOptions,
} from "../gpu/runtime_options.ts";
import { type CallLimits, DEFAULT_CALL_LIMITS } from "../service/validate.ts";
import {
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_MAX_JSON_BODY_BYTES,
  MAX_JSON_BODY_BYTES_CEILING,
} from "./body.ts";
import { MAX_JSON_VALUES } from "../wire/json_scan.ts";
import { INSTANCE_NAME_PATTERN } from "../wire/names.ts";
import { DEFAULT_SHUTDOWN_DEADLINE_MS } from "./shutdown.ts";
import { BODY_TIMEOUT_ENV, bodyTimeoutOption, DEFAULT_BODY_TIMEOUT_MS } from "./body_timeout.ts";
import {
  checkKeepWarmOptions,
  KEEP_WARM_DEFAULTS,
  KEEP_WARM_MODES,
  type KeepWarmMode,
  type KeepWarmOptions,
} from "../gpu/keep_warm.ts";
import { envVar } from "../core/env.ts";
/** Default memory budget for server-held caches: 4 GiB. */
export const DEFAULT_MEMORY_BUDGET_BYTES = 4 * 1024 ** 3;

/** The environment variable of `--http-workers`. */
export const HTTP_WORKERS_ENV = "ATTN_HTTP_WORKERS";

/** The environment variable of `--keep-warm-ms`. */
export const KEEP_WARM_ENV = "ATTN_KEEP_WARM_MS";

/** Default HTTP worker threads. */
export const DEFAULT_HTTP_WORKERS = 0;

/** Most HTTP worker threads, and most device threads. */
export const MAX_HTTP_WORKERS = 64;

/** The environment variable of `--device-threads`. */
export const DEVICE_THREADS_ENV = "ATTN_DEVICE_THREADS";

/** The environment variable of `--device-threads-http` (`1` or `0`). */
export const DEVICE_THREADS_HTTP_ENV = "ATTN_DEVICE_THREADS_HTTP";

export const HELP = `attention service: batched paged attention over HTTP

usage: deno task serve [options]

  --port N                  port to listen on (default 8000; 0 = any free port)
  --host H                  address to bind (default 127.0.0.1); any address that is not
                            loopback needs a token (or --allow-unauthenticated)
  --max-body-bytes B        largest request body in bytes (default ${DEFAULT_MAX_BODY_BYTES} = 512 MiB)
  --max-json-body-bytes B   largest JSON body in bytes (default ${DEFAULT_MAX_JSON_BODY_BYTES} = 64 MiB,
                            at most ${MAX_JSON_BODY_BYTES_CEILING}); a JSON body also holds at most
                            ${MAX_JSON_VALUES} values: big tensors belong in safetensors bodies
  --memory-budget-bytes B   total bytes of server-held KV caches (default ${DEFAULT_MEMORY_BUDGET_BYTES} = 4 GiB)
  --max-tokens-per-call N   most query tokens in one forward call (default ${DEFAULT_CALL_LIMITS.max_tokens}); over: 422
  --max-attended-keys N     most attended keys in one forward call: the sum over query tokens of
                            the keys each may see (default ${DEFAULT_CALL_LIMITS.max_attended_keys}); over: 422
  --token-file PATH         bearer token (the file's content) required on every route but
                            /healthz; without it the ATTN_TOKEN environment variable is used
  --allow-unauthenticated   serve a non-loopback address without a token (prints a warning)
  --allowed-host NAME       a loopback bind without a token answers only requests whose Host is
                            localhost, 127.0.0.1 or [::1] (any port), else 403; this adds a
                            name (repeatable)
  --shutdown-deadline-ms N  on SIGTERM/SIGINT, wait this long for calls in flight, then
                            exit (default ${DEFAULT_SHUTDOWN_DEADLINE_MS}); exit code 0 when all
                            finished, 1 when the deadline cut some off
  --body-timeout-ms N       the longest wait for a request body's next bytes (default
                            ${DEFAULT_BODY_TIMEOUT_MS}; a body read in one piece must be whole by
                            then plus 1 s per 256 KiB declared; also ${BODY_TIMEOUT_ENV});
                            over: 408 body_timeout
  --no-gpu                  do not acquire a WebGPU device (host backends only)
  --http-workers N          HTTP worker threads in front of the thread that owns the GPU:
                            they read requests and write answers, this thread validates,
                            plans and runs the calls (default ${DEFAULT_HTTP_WORKERS}; 0 = one thread
                            does it all; also ${HTTP_WORKERS_ENV}; Linux: they share the port)
  --device-threads N        worker threads that each own a WebGPU device of their own and a
                            service over it, this thread doing the HTTP work and sending each
                            call to the thread holding its cache; calls on caches of different
                            threads run side by side (default 0 = this thread owns the device;
                            also ${DEVICE_THREADS_ENV}; not with --http-workers). Each thread
                            gets 1/N of --memory-budget-bytes; keep-warm runs on thread 0
  --device-threads-http     with --device-threads: each device thread also serves the port
                            (Linux: the kernel spreads connections over the threads) and
                            answers the calls on its own caches itself, with no hop through
                            this thread; a cache created on a thread's connection is placed on
                            it when it has room (also ${DEVICE_THREADS_HTTP_ENV}=1)
  --keep-warm-ms N          keep the GPU busy for N ms after each call with short spin
                            dispatches, so its clock stays up between calls (default 0 = off;
                            also ${KEEP_WARM_ENV}); draws power. Needs a runtime whose completion
                            wait does not block (Dawn); elsewhere it stays off and says why
  --keep-warm-spin-iters N  dependent FMA pairs per spin dispatch (default ${KEEP_WARM_DEFAULTS.spin_iters})
  --keep-warm-workgroups N  workgroups of 64 lanes per spin dispatch (default ${KEEP_WARM_DEFAULTS.workgroups})
  --keep-warm-depth N       spin dispatches per tick (timer, process) or kept queued (await),
                            1-8 (default ${KEEP_WARM_DEFAULTS.depth})
  --keep-warm-mode M        timer: spins submitted from a timer, nothing awaited (default);
                            await: a loop awaiting each spin (keeps Dawn's event loop busy);
                            process: the spins in a Deno process of its own, with its own Dawn
                            device (needs --allow-run; the serving thread only signals use)
  --keep-warm-period-ms N   timer, process: ms between ticks, 1-1000 (default ${KEEP_WARM_DEFAULTS.period_ms})
  --instance-name NAME      name this instance in every answer's X-Attention-Instance header
                            and in /healthz (1-64 characters of A-Z a-z 0-9 . _ -; default none)
${RUNTIME_HELP}
  -h, --help                show this help
`;

function intFlag(name: string, v: string | undefined, dflt: number, min: number): number {
  if (v === undefined) return dflt;
  if (!/^\d+$/.test(v) || Number(v) < min || !Number.isSafeInteger(Number(v))) {
    throw new Error(`--${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`);
  }
  return Number(v);
}

/** `--http-workers` / `--device-threads` (over the environment variable, over the default). */
function threadsOption(
  flagName: string,
  envName: string,
  flag: string | undefined,
  env: string | undefined,
): number {
  const name = flag !== undefined ? flagName : envName;
  const v = flag ?? (env === "" ? undefined : env);
  if (v === undefined) return DEFAULT_HTTP_WORKERS;
  if (!/^\d+$/.test(v) || Number(v) > MAX_HTTP_WORKERS) {
    throw new Error(
      `${name} must be an integer from 0 to ${MAX_HTTP_WORKERS}, got ${JSON.stringify(v)}`,
    );
  }
  return Number(v);
}

/** `--device-threads-http` (the flag, else the environment variable: `1` or `0`). */
function deviceThreadsHttpOption(flag: boolean | undefined, env: string | undefined): boolean {
  if (flag !== undefined) return flag;
  if (env === undefined || env === "") return false;
  if (env !== "0" && env !== "1") {
    throw new Error(`${DEVICE_THREADS_HTTP_ENV} must be 0 or 1, got ${JSON.stringify(env)}`);
  }
  return env === "1";
}

/** `--keep-warm-mode`. */
function keepWarmMode(v: string | undefined): KeepWarmMode {
  if (v === undefined) return KEEP_WARM_DEFAULTS.mode;
  const mode = KEEP_WARM_MODES.find((m) => m === v);
  if (!mode) {
    throw new Error(
      `--keep-warm-mode must be one of ${KEEP_WARM_MODES.join(", ")}, got ${JSON.stringify(v)}`,
    );
  }
  return mode;
}

/** `--keep-warm-*` (the hold also from the environment variable). */
function keepWarmOptions(
  values: Record<string, string | boolean | string[] | undefined>,
  env: string | undefined,
): KeepWarmOptions {
  const flag = (k: string) => values[k] as string | undefined;
  const d = KEEP_WARM_DEFAULTS;
  const hold = flag("keep-warm-ms") ?? (env === "" ? undefined : env);
  if (hold !== undefined && !/^\d+$/.test(hold)) {
    const name = flag("keep-warm-ms") !== undefined ? "--keep-warm-ms" : KEEP_WARM_ENV;
    throw new Error(`${name} must be an integer >= 0, got ${JSON.stringify(hold)}`);
  }
  const o = {
    hold_ms: hold === undefined ? d.hold_ms : Number(hold),
    spin_iters: intFlag("keep-warm-spin-iters", flag("keep-warm-spin-iters"), d.spin_iters, 1),
    workgroups: intFlag("keep-warm-workgroups", flag("keep-warm-workgroups"), d.workgroups, 1),
    depth: intFlag("keep-warm-depth", flag("keep-warm-depth"), d.depth, 1),
    mode: keepWarmMode(flag("keep-warm-mode")),
    period_ms: intFlag("keep-warm-period-ms", flag("keep-warm-period-ms"), d.period_ms, 1),
  };
  return checkKeepWarmOptions(o);
}

/** The environment variables serve reads (none without env permission). */
export function serveEnv(): Record<string, string | undefined> {
  const env = runtimeEnv();
  env[HTTP_WORKERS_ENV] = envVar(HTTP_WORKERS_ENV);
  env[DEVICE_THREADS_ENV] = envVar(DEVICE_THREADS_ENV);
  env[DEVICE_THREADS_HTTP_ENV] = envVar(DEVICE_THREADS_HTTP_ENV);
  env[KEEP_WARM_ENV] = envVar(KEEP_WARM_ENV);
  env[BODY_TIMEOUT_ENV] = envVar(BODY_TIMEOUT_ENV);
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

/**
 * Parses the command line; `env` supplies ATTN_WEBGPU_RUNTIME / ATTN_DAWN_FLAGS.
 * @throws Error with a usage message on bad flags.
 */
export function parseServeArgs(
  args: string[],
  env: Record<string, string | undefined> = {},
): ServeOptions {
  const { values } = parseArgs({
    args,
    options: {
      port: { type: "string" },
      host: { type: "string" },
      "max-body-bytes": { type: "string" },
      "max-json-body-bytes": { type: "string" },
      "memory-budget-bytes": { type: "string" },
      "max-tokens-per-call": { type: "string" },
      "max-attended-keys": { type: "string" },
      "token-file": { type: "string" },
      "allow-unauthenticated": { type: "boolean" },
      "allowed-host": { type: "string", multiple: true },
      "shutdown-deadline-ms": { type: "string" },
      "body-timeout-ms": { type: "string" },
      "no-gpu": { type: "boolean" },
      "instance-name": { type: "string" },
      "http-workers": { type: "string" },
      "device-threads": { type: "string" },
      "device-threads-http": { type: "boolean" },
      "keep-warm-ms": { type: "string" },
      "keep-warm-spin-iters": { type: "string" },
      "keep-warm-workgroups": { type: "string" },
      "keep-warm-depth": { type: "string" },
      "keep-warm-mode": { type: "string" },
      "keep-warm-period-ms": { type: "string" },
      "webgpu-runtime": { type: "string" },
      "dawn-flags": { type: "string" },
      "dawn-flag": { type: "string", multiple: true },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
    allowPositionals: false,
  });
  const port = intFlag("port", values.port, 8000, 0);
  if (port > 65535) throw new Error(`--port must be <= 65535, got ${port}`);
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
  const tokenFile = values["token-file"];
  const instanceName = values["instance-name"];
  if (instanceName !== undefined && !INSTANCE_NAME_PATTERN.test(instanceName)) {
    throw new Error(
      `--instance-name must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or ` +
        `digit, got ${JSON.stringify(instanceName)}`,
    );
  }
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
    throw new Error(
      `--http-workers (${httpWorkers}) and --device-threads (${deviceThreads}) exclude each other`,
    );
  }
  const deviceThreadsHttp = deviceThreadsHttpOption(
    values["device-threads-http"],
    env[DEVICE_THREADS_HTTP_ENV],
  );
  if (deviceThreadsHttp && deviceThreads === 0) {
    throw new Error("--device-threads-http needs --device-threads N with N >= 1, got 0");
  }
  return {
    port,
    host: values.host ?? "127.0.0.1",
    maxBodyBytes: intFlag("max-body-bytes", values["max-body-bytes"], DEFAULT_MAX_BODY_BYTES, 1),
    maxJsonBodyBytes: maxJson,
    memoryBudgetBytes: intFlag(
      "memory-budget-bytes",
      values["memory-budget-bytes"],
      DEFAULT_MEMORY_BUDGET_BYTES,
      0,
    ),
    limits: {
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
    },
    ...(tokenFile !== undefined ? { tokenFile } : {}),
    allowUnauthenticated: values["allow-unauthenticated"] ?? false,
    allowedHosts: values["allowed-host"] ?? [],
    shutdownDeadlineMs: intFlag(
      "shutdown-deadline-ms",
      values["shutdown-deadline-ms"],
      DEFAULT_SHUTDOWN_DEADLINE_MS,
      0,
    ),
    bodyTimeoutMs: bodyTimeoutOption(values["body-timeout-ms"], env[BODY_TIMEOUT_ENV]),
    gpu: !values["no-gpu"],
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
