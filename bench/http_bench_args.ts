/**
 * The command line of `deno task bench:http` (bench/http_bench.ts): its flags, the `--help`
 * text, and their parse into {@link HttpBenchArgs}.
 * @module
 */
import { parseArgs } from "node:util";
import type { RunOptions } from "./http_run.ts";
import { CLIENT_KINDS, type ClientKind } from "./http_client.ts";
import type { HttpShape } from "./http_workload.ts";

const SHAPE_FLAGS: Record<string, keyof HttpShape> = {
  reqs: "reqs",
  ctx: "ctx",
  heads: "num_heads",
  "kv-heads": "num_kv_heads",
  "head-size": "head_size",
  "block-size": "block_size",
  "prefill-reqs": "prefill_reqs",
  "prefill-tokens": "prefill_tokens",
  steps: "steps",
  clients: "clients",
  layers: "layers",
};

export const HELP = `deno task bench:http [options]

  --url URL[,URL...]      bench a running server (no server is started), or several instances
                          of one (client c's caches and calls on instance c mod N)
  --instances N,M         start N servers at once per runtime (each its own process and
                          device; then M), the clients spread over them as with several
                          --url (default 1)
  --runtimes A,B          start server/main.ts once per runtime, with --webgpu-runtime A, ...
                          (default: once, with the server's default runtime)
  --device-threads N,M    start each runtime's server once per count, with --device-threads N
                          (0: the main thread owns the device; default: the server's default)
  --http-workers N,M       start each runtime's server once per count, with --http-workers N
                          (0: one thread; default: the server's default)
  --server-arg ARG        pass ARG to the started server (repeatable), e.g. --server-arg=--no-gpu
  --token T               bearer token for the server (default: env ATTN_TOKEN)
  --client raw|fetch      the clients' HTTP: raw = the bench's own keep-alive HTTP/1.1
                          connection (default; bench/http_conn.ts), fetch = Deno's fetch
  --small | --big         shapes (default: small on a software adapter or without a device)
  --reqs N --ctx N --heads N --kv-heads N --head-size N --block-size N
  --prefill-reqs N --prefill-tokens N   requests and tokens of each per prefill call
  --steps N               decode steps per client per phase (big 64, small 16)
  --clients N             concurrent clients, each on its own caches (default 8)
  --layers N              caches (layers) per client; each step calls every layer with the
                          same metadata, as an engine does (default 1)
  --warmup-calls N        untimed decode calls before the sequential timed ones, the first the
                          cold call (default 1000, about a second of serving: the server's
                          JIT warm, as an engine's is (256 before v0.36 left it warming);
                          1: one cold call, the protocol before v0.7); they repeat the
                          timed requests and end on the last, so with --steps over 4 no timed
                          step finds a plan they left; each concurrent client makes as many
                          of its own before the clients start together (from v0.36)
  --check-rows N          (token, head) rows checked per decode answer (default 8)
  --prefill-check-rows N  rows checked per prefill answer (default 32)
  --seed N                data seed, >= 1 (default 1)
  --startup-timeout-s N   wait this long for the server's listening line (default 180)
  --json                  print one JSON document instead of the report
  --json-out FILE         also write that JSON document to FILE
`;

/** Parsed command line. */
export interface HttpBenchArgs {
  /** Running instances to bench (no server started). */
  url?: string[];
  /** Servers started at once per runtime and worker count, one run per count (default [1]). */
  instances: number[];
  runtimes: string[] | null;
  /** `--http-workers` counts to start each runtime's server with (null: the server's default). */
  httpWorkers: number[] | null;
  /** `--device-threads` counts likewise. */
  deviceThreads: number[] | null;
  serverArgs: string[];
  startupTimeoutMs: number;
  json: boolean;
  /** Also write the JSON document to this file. */
  jsonOut?: string;
  help: boolean;
  run: Omit<RunOptions, "log">;
}

function positive(name: string, v: string): number {
  const n = Number(v);
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(n) || n < 1) {
    throw new Error(`--${name} must be a positive integer, got ${JSON.stringify(v)}`);
  }
  return n;
}

/** A list of counts >= 0 (`--http-workers 0,2`), or null when the flag is absent. */
function counts(name: string, v: string | undefined): number[] | null {
  return v?.split(",").map((x) => x.trim()).map((x) => {
    if (!/^\d+$/.test(x)) throw new Error(`--${name} must be integers >= 0, got ${x}`);
    return Number(x);
  }) ?? null;
}

/** Parses the command line. @throws Error naming the bad flag. */
export function parseHttpBenchArgs(args: string[], env = Deno.env.toObject()): HttpBenchArgs {
  const options: Record<string, { type: "string" | "boolean"; multiple?: boolean }> = {
    url: { type: "string" },
    runtimes: { type: "string" },
    "http-workers": { type: "string" },
    "device-threads": { type: "string" },
    instances: { type: "string" },
    "server-arg": { type: "string", multiple: true },
    token: { type: "string" },
    client: { type: "string" },
    small: { type: "boolean" },
    big: { type: "boolean" },
    "check-rows": { type: "string" },
    "warmup-calls": { type: "string" },
    "prefill-check-rows": { type: "string" },
    seed: { type: "string" },
    "startup-timeout-s": { type: "string" },
    json: { type: "boolean" },
    "json-out": { type: "string" },
    help: { type: "boolean" },
  };
  for (const k of Object.keys(SHAPE_FLAGS)) options[k] = { type: "string" };
  const { values: v } = parseArgs({ args, options, strict: true, allowPositionals: false });
  const str = (k: string) => v[k] as string | undefined;
  if (v.small && v.big) throw new Error("--small and --big exclude each other");
  if (v.url !== undefined && (v["http-workers"] ?? v["device-threads"]) !== undefined) {
    throw new Error(
      "--url and --http-workers / --device-threads exclude each other (a running server has its own)",
    );
  }
  if (v.url !== undefined && v.runtimes !== undefined) {
    throw new Error("--url and --runtimes exclude each other (a running server has one runtime)");
  }
  if (v.url !== undefined && v.instances !== undefined) {
    throw new Error("--url and --instances exclude each other (give each instance's URL)");
  }
  const shape: Partial<HttpShape> = {};
  for (const [flag, key] of Object.entries(SHAPE_FLAGS)) {
    if (str(flag) !== undefined) shape[key] = positive(flag, str(flag)!);
  }
  const token = str("token") ?? env.ATTN_TOKEN;
  const client = (str("client") ?? "raw") as ClientKind;
  if (!CLIENT_KINDS.includes(client)) {
    throw new Error(
      `--client must be one of ${CLIENT_KINDS.join(", ")}, got ${JSON.stringify(client)}`,
    );
  }
  return {
    url: str("url")?.split(",").map((x) => x.trim().replace(/\/+$/, "")).filter(Boolean),
    instances: (str("instances") ?? "1").split(",").map((x) => positive("instances", x.trim())),
    runtimes: str("runtimes")?.split(",").map((x) => x.trim()).filter(Boolean) ?? null,
    httpWorkers: counts("http-workers", str("http-workers")),
    deviceThreads: counts("device-threads", str("device-threads")),
    serverArgs: (v["server-arg"] as string[] | undefined) ?? [],
    startupTimeoutMs: 1000 * positive("startup-timeout-s", str("startup-timeout-s") ?? "180"),
    json: v.json === true,
    jsonOut: str("json-out"),
    help: v.help === true,
    run: {
      size: v.small ? "small" : v.big ? "big" : "auto",
      shape,
      seed: str("seed") === undefined ? 1 : positive("seed", str("seed")!),
      check_rows: positive("check-rows", str("check-rows") ?? "8"),
      warmup_calls: positive("warmup-calls", str("warmup-calls") ?? "1000"),
      prefill_check_rows: positive("prefill-check-rows", str("prefill-check-rows") ?? "32"),
      full_prefill_limit: 3e8,
      headers: token ? { authorization: `Bearer ${token}` } : {},
      client,
    },
  };
}
