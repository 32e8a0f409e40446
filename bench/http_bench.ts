/**
 * `deno task bench:http [--runtimes deno,dawn | --url URL] [--small|--big] [--json] ...`: the
 * HTTP mode of the bench. Drives the real server over loopback like a model runner (a
 * server-held f16 cache filled by prefill calls, then timed decode steps, sequential and from
 * concurrent clients, safetensors both ways on keep-alive connections), checks every answer
 * against its own float64 reference on a sample of rows, and prints round-trip p50/p99 and
 * calls/s per runtime beside issue 7's H200 targets and the server's own per-phase timings.
 *
 * Without `--url` it starts `server/main.ts --port 0` once per runtime of `--runtimes`
 * (passing `--webgpu-runtime NAME`; none given: one server with its default runtime), or
 * `--instances N` servers at once (each its own process and device; client c on instance c mod
 * N, as deploy/'s nginx front pins caches to instances). A server that exits before listening
 * (a runtime that cannot start) is reported unavailable with its own stderr, and the next
 * runtime runs. `--help` lists every flag.
 * @module
 */
import { parseArgs } from "node:util";
import { formatRuntime, formatSummary, type RuntimeReport, TARGETS } from "./http_report.ts";
import { runOnServer, type RunOptions } from "./http_run.ts";
import { CLIENT_KINDS, type ClientKind } from "./http_client.ts";
import { killStarted, type ServerProcess, startServer } from "./http_server.ts";
import { BIG_SHAPE, cacheBytes, type HttpShape, layoutOf } from "./http_workload.ts";

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

/** The memory budget a started server needs: every client's cache of the biggest shape asked. */
function budgetArgs(a: HttpBenchArgs): string[] {
  if (a.serverArgs.some((x) => x.startsWith("--memory-budget-bytes"))) return [];
  const s = { ...BIG_SHAPE, ...a.run.shape };
  const need = s.clients * s.layers * cacheBytes(s, layoutOf(s, 0));
  return need * 1.25 > 4 * 2 ** 30 ? [`--memory-budget-bytes=${Math.ceil(need * 1.25)}`] : [];
}

/**
 * Runs the bench for each runtime asked (or on the given server), handing each runtime's
 * report to `done` as soon as it is complete; never throws for a runtime.
 */
export async function runHttpBench(
  a: HttpBenchArgs,
  log: (line: string) => void = () => {},
  done: (r: RuntimeReport) => void = () => {},
): Promise<RuntimeReport[]> {
  const opts: RunOptions = { ...a.run, log };
  const out: RuntimeReport[] = [];
  const finish = (r: RuntimeReport, workers?: number, instances = 1, threads?: number) => {
    if (workers !== undefined) r.http_workers = workers;
    if (threads !== undefined) r.device_threads = threads;
    if (instances > 1) r.instances = instances;
    out.push(r);
    done(r);
  };
  const bench = async (runtime: string, url: string[]): Promise<RuntimeReport> => {
    try {
      return { runtime, available: true, run: await runOnServer(url, opts) };
    } catch (e) {
      return { runtime, available: true, error: e instanceof Error ? e.message : String(e) };
    }
  };
  if (a.url) {
    finish(await bench("url", a.url));
    return out;
  }
  const servers = (a.runtimes ?? ["default"]).flatMap((runtime) =>
    (a.httpWorkers ?? [undefined]).flatMap((workers) =>
      (a.deviceThreads ?? [undefined]).flatMap((threads) =>
        a.instances.map((instances) => ({ runtime, workers, threads, instances }))
      )
    )
  );
  for (const { runtime, workers, threads, instances } of servers) {
    const flags = runtime === "default" ? [] : [`--webgpu-runtime=${runtime}`];
    if (workers !== undefined) flags.push(`--http-workers=${workers}`);
    if (threads !== undefined) flags.push(`--device-threads=${threads}`);
    const args = [...flags, ...budgetArgs(a), ...a.serverArgs];
    log(`starting server/main.ts ${args.join(" ")}`);
    const started = await startServers(args, instances, a.startupTimeoutMs);
    if (!started.ok) {
      log(`runtime ${runtime}: unavailable: ${started.reason}`);
      finish({ runtime, available: false, reason: started.reason }, workers, instances, threads);
      continue;
    }
    const srvs = started.servers;
    const report = await bench(runtime, srvs.map((s) => s.url));
    const exit_codes = await Promise.all(srvs.map((s) => s.stop()));
    report.server = {
      startup_ms: Math.max(...srvs.map((s) => s.startup_ms)),
      stderr: srvs[0].stderr(),
      exit_code: exit_codes.find((c) => c !== 0) ?? exit_codes[0],
    };
    finish(report, workers, instances, threads);
  }
  return out;
}

/**
 * Starts `n` servers with `args`, one after another (each compiles its own pipelines); if one
 * cannot start, those started are stopped and its reason is the outcome.
 */
async function startServers(
  args: string[],
  n: number,
  timeoutMs: number,
): Promise<{ ok: true; servers: ServerProcess[] } | { ok: false; reason: string }> {
  const servers: ServerProcess[] = [];
  for (let i = 0; i < n; i++) {
    const started = await startServer(args, timeoutMs);
    if (!started.ok) {
      await Promise.all(servers.map((s) => s.stop()));
      return { ok: false, reason: n > 1 ? `instance ${i}: ${started.reason}` : started.reason };
    }
    servers.push(started.server);
  }
  return { ok: true, servers };
}

/** Did a runtime fail (or none run at all)? One unavailable beside others is no failure. */
export function anyFailed(rs: RuntimeReport[]): boolean {
  return rs.some((r) => r.error !== undefined || (r.run !== undefined && !r.run.ok)) ||
    !rs.some((r) => r.available);
}

async function main(): Promise<void> {
  let a: HttpBenchArgs;
  try {
    a = parseHttpBenchArgs(Deno.args);
  } catch (e) {
    console.error(`${e instanceof Error ? e.message : e}\n\n${HELP}`);
    Deno.exit(2);
  }
  if (a.help) {
    console.log(HELP);
    return;
  }
  // Cut short (e.g. by timeout(1)): take the started server along.
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    Deno.addSignalListener(sig, () => {
      killStarted();
      Deno.exit(sig === "SIGINT" ? 130 : 143);
    });
  }
  // The text report of each runtime goes out as soon as it is done (a run cut short by a
  // time limit still leaves the runtimes before it).
  const reports = await runHttpBench(
    a,
    a.json ? () => {} : (l) => console.error(l),
    a.json ? () => {} : (r) => console.log(formatRuntime(r).join("\n") + "\n"),
  );
  const doc = JSON.stringify(
    { seed: a.run.seed, h200_targets: TARGETS, runtimes: reports },
    null,
    2,
  );
  if (a.jsonOut) await Deno.writeTextFile(a.jsonOut, doc + "\n");
  console.log(a.json ? doc : formatSummary(reports).join("\n"));
  Deno.exit(anyFailed(reports) ? 1 : 0);
}

if (import.meta.main) await main();
