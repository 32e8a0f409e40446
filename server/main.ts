/**
 * The entry point: `deno task serve [options]` (`--help` lists them). Resolves the access
 * policy (a non-loopback bind needs a token), selects the WebGPU runtime (`--webgpu-runtime
 * deno|dawn|auto`) and acquires the device (unless --no-gpu), builds the service and serves
 * it; on SIGTERM or SIGINT it stops taking calls (after a 100 ms settle window; later ones get
 * a 503 `shutting_down`), finishes the calls it took up to `--shutdown-deadline-ms`, closes the
 * listener and exits (0 when every call finished, 1 when the deadline cut some off; a second
 * signal exits 1 at once). Exits 2 on a bad command line, a refused access configuration or
 * an explicit runtime that cannot start. With `--http-workers N` the HTTP work runs on N worker
 * threads (worker_front.ts) and this thread keeps the device and the service. The only modules
 * that call Deno.serve are this one and the HTTP worker (http_worker.ts).
 * @module
 */
import { parseArgs } from "node:util";
import { builtinBackends } from "../backends/index.ts";
import {
  resolveRuntimeOptions,
  RUNTIME_HELP,
  runtimeEnv,
  type RuntimeOptions,
} from "../gpu/runtime_options.ts";
import { acquireDevice } from "./device_setup.ts";
import { AttentionService } from "../service/service.ts";
import { type CallLimits, DEFAULT_CALL_LIMITS } from "../service/validate.ts";
import { AccessConfigError, resolveAccess, type ResolvedAccess } from "./access_config.ts";
import {
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_MAX_JSON_BODY_BYTES,
  MAX_JSON_BODY_BYTES_CEILING,
} from "./body.ts";
import { createHandler } from "./handler.ts";
import { sharedJsonDecoder } from "./json_decoder.ts";
import { MAX_JSON_VALUES } from "../wire/json_scan.ts";
import { INSTANCE_HEADER, INSTANCE_NAME_PATTERN } from "../wire/names.ts";
import { DEFAULT_SHUTDOWN_DEADLINE_MS, Drainer } from "./shutdown.ts";
import { serveWithWorkers } from "./worker_front.ts";
import { serveLentBodies } from "./lent_body.ts";

/** Default memory budget for server-held caches: 4 GiB. */
export const DEFAULT_MEMORY_BUDGET_BYTES = 4 * 1024 ** 3;

/** The environment variable of `--http-workers`. */
export const HTTP_WORKERS_ENV = "ATTN_HTTP_WORKERS";

/** Default HTTP worker threads. */
export const DEFAULT_HTTP_WORKERS = 0;

/** Most HTTP worker threads. */
export const MAX_HTTP_WORKERS = 64;

const HELP = `attention service: batched paged attention over HTTP

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
  --no-gpu                  do not acquire a WebGPU device (host backends only)
  --http-workers N          HTTP worker threads in front of the thread that owns the GPU:
                            they read requests and write answers, this thread validates,
                            plans and runs the calls (default ${DEFAULT_HTTP_WORKERS}; 0 = one thread
                            does it all; also ${HTTP_WORKERS_ENV}; Linux: they share the port)
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

/** `--http-workers` (over the environment variable, over the default). */
function httpWorkersOption(flag: string | undefined, env: string | undefined): number {
  const name = flag !== undefined ? "--http-workers" : HTTP_WORKERS_ENV;
  const v = flag ?? (env === "" ? undefined : env);
  if (v === undefined) return DEFAULT_HTTP_WORKERS;
  if (!/^\d+$/.test(v) || Number(v) > MAX_HTTP_WORKERS) {
    throw new Error(
      `${name} must be an integer from 0 to ${MAX_HTTP_WORKERS}, got ${JSON.stringify(v)}`,
    );
  }
  return Number(v);
}

/** The environment variables serve reads (none without env permission). */
function serveEnv(): Record<string, string | undefined> {
  const env = runtimeEnv();
  try {
    env[HTTP_WORKERS_ENV] = Deno.env.get(HTTP_WORKERS_ENV);
  } catch { /* no env permission: as if unset */ }
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
  gpu: boolean;
  /** HTTP worker threads (0: Deno.serve on this thread). */
  httpWorkers: number;
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
      "no-gpu": { type: "boolean" },
      "instance-name": { type: "string" },
      "http-workers": { type: "string" },
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
    gpu: !values["no-gpu"],
    httpWorkers: httpWorkersOption(values["http-workers"], env[HTTP_WORKERS_ENV]),
    ...(instanceName !== undefined ? { instanceName } : {}),
    runtime: resolveRuntimeOptions({
      runtime: values["webgpu-runtime"],
      dawnFlags: values["dawn-flags"],
      dawnFlag: values["dawn-flag"],
    }, env),
    help: values.help ?? false,
  };
}

/** Adds `X-Attention-Instance` to every answer, the drainer's own 503s included. */
function named(
  handler: (req: Request) => Promise<Response>,
  name: string | undefined,
): (req: Request) => Promise<Response> {
  if (name === undefined) return handler;
  return async (req) => {
    const res = await handler(req);
    res.headers.set(INSTANCE_HEADER, name);
    return res;
  };
}

function describeAccess(a: ResolvedAccess): string {
  if (a.policy.token !== undefined) return `auth: bearer token (from ${a.tokenSource})`;
  if (a.policy.allowedHosts) {
    return `auth: none (loopback); Host: ${a.policy.allowedHosts.join(", ")}`;
  }
  return "auth: none";
}

async function main(): Promise<void> {
  let o: ServeOptions;
  let access: ResolvedAccess;
  try {
    o = parseServeArgs(Deno.args, serveEnv());
    if (o.help) {
      console.log(HELP);
      return;
    }
    access = resolveAccess(o);
  } catch (e) {
    const usage = e instanceof AccessConfigError ? "" : `\n\n${HELP}`;
    console.error(`${e instanceof Error ? e.message : e}${usage}`);
    Deno.exit(2);
  }
  if (access.warning) console.error(access.warning);
  console.error(describeAccess(access));
  if (o.instanceName !== undefined) console.error(`instance: ${o.instanceName}`);
  const { device, close: closeDevice } = await acquireDevice(o.gpu, o.runtime);
  const service = new AttentionService({
    backends: builtinBackends(),
    device,
    memoryBudgetBytes: o.memoryBudgetBytes,
    limits: o.limits,
  });
  const drainer = new Drainer();
  const handler = createHandler(service, {
    maxBodyBytes: o.maxBodyBytes,
    maxJsonBodyBytes: o.maxJsonBodyBytes,
    access: access.policy,
    instance: o.instanceName,
  });
  const onListen = ({ hostname, port }: { hostname: string; port: number }) => {
    const h = hostname.includes(":") ? `[${hostname}]` : hostname;
    console.log(`listening on http://${h}:${port}`);
  };
  const serve = named(drainer.track(handler), o.instanceName);
  let server: { shutdown(): Promise<void>; finished: Promise<void> };
  if (o.httpWorkers === 0) {
    server = Deno.serve({ port: o.port, hostname: o.host, onListen }, serveLentBodies(serve));
  } else {
    try {
      server = await serveWithWorkers({
        workers: o.httpWorkers,
        port: o.port,
        hostname: o.host,
        access: access.policy,
        maxBodyBytes: o.maxBodyBytes,
        onListen,
      }, serve);
    } catch (e) {
      console.error(
        `cannot serve with ${o.httpWorkers} HTTP workers: ${e instanceof Error ? e.message : e}`,
      );
      Deno.exit(1);
    }
    console.error(`http workers: ${o.httpWorkers}`);
  }
  let stopping = false;
  const stop = async (sig: string) => {
    if (stopping) {
      console.error(`${sig} again: exiting now with ${drainer.count} calls unfinished`);
      Deno.exit(1);
    }
    stopping = true;
    console.error(
      `${sig}: stopping; finishing ${drainer.count} calls in flight ` +
        `(deadline ${o.shutdownDeadlineMs} ms)`,
    );
    const r = await drainer.drain(server, { deadlineMs: o.shutdownDeadlineMs });
    if (r.drained) {
      await service.close();
      sharedJsonDecoder.close();
      closeDevice();
      console.error(`stopped: every call finished (${r.ms.toFixed(0)} ms)`);
      Deno.exit(0);
    }
    console.error(`stopped at the deadline: ${r.unfinished} calls unfinished`);
    Deno.exit(1);
  };
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    try {
      Deno.addSignalListener(sig, () => void stop(sig));
    } catch { /* signal not supported here */ }
  }
  await server.finished;
}

if (import.meta.main) await main();
