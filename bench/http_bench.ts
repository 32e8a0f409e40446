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
 *
 * The parts live beside it: the command line and `--help` text (bench/http_bench_args.ts) and
 * the runs over every server asked (bench/http_bench_runtimes.ts); their exports are
 * re-exported here.
 * @module
 */
import { formatRuntime, formatSummary, type RuntimeReport, TARGETS } from "./http_report.ts";
import { runHttpBench } from "./http_bench_runtimes.ts";
import { HELP, type HttpBenchArgs, parseHttpBenchArgs } from "./http_bench_args.ts";
import { killStarted } from "./http_server.ts";

export { HELP, parseHttpBenchArgs, runHttpBench };
export type { HttpBenchArgs };

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
