/**
 * The HTTP bench over every server asked (bench/http_bench.ts): on the `--url` instances, or
 * once per runtime, `--http-workers` count, `--device-threads` count and `--instances` count,
 * each time starting that many servers (bench/http_server.ts), running bench/http_run.ts on
 * them and stopping them; a server set that cannot start is reported unavailable.
 * @module
 */
import type { RuntimeReport } from "./http_report.ts";
import { runOnServer, type RunOptions } from "./http_run.ts";
import { type ServerProcess, startServer } from "./http_server.ts";
import { BIG_SHAPE, cacheBytes, layoutOf } from "./http_workload.ts";
import type { HttpBenchArgs } from "./http_bench_args.ts";

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
