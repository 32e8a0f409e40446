/**
 * The decode phase of an HTTP bench run (bench/http_run.ts): timed decode steps from client 0
 * alone, then from every client at once (each from its own worker), with the servers' Dawn poll
 * ticks around each phase, and the answers checked after the clock.
 * @module
 */
import { checkDecode } from "./http_checks.ts";
import { type DecodeCall, type DecodeJob, runDecode } from "./http_client.ts";
import { concurrently } from "./http_clients.ts";
import { type PollTicks, serverPollTicks, ticksBetween } from "./http_dawn_poll.ts";
import type { Reference } from "./http_reference.ts";
import { CpuBracket } from "./http_server_cpu.ts";
import { phaseStats } from "./http_stats.ts";
import type { Layout } from "./http_workload.ts";
import type { RunOptions, RunReport } from "./http_run_types.ts";
import { uniq } from "./uniq.ts";

/** The poll ticks of every instance, summed (null when one has none: not Dawn). */
async function allPollTicks(
  urls: string[],
  headers: Record<string, string>,
): Promise<PollTicks | null> {
  const all = await Promise.all(urls.map((u) => serverPollTicks(u, headers)));
  if (all.some((t) => !t)) return null;
  return all.reduce<PollTicks>(
    (a, t) => ({ immediate: a.immediate + t!.immediate, paced: a.paced + t!.paced }),
    { immediate: 0, paced: 0 },
  );
}

/**
 * Decode: client 0 alone on its caches (steps 0..steps-1 after `warmup_calls` untimed calls,
 * the first of them step 0's: the cold call), then every client at once (client 0 continuing
 * from step `steps`), each from its own worker, each after as many untimed calls of its own
 * made before the start (a worker's JIT starts cold: without them the 8-client phase timed
 * the clients' unoptimized code too).
 */
export async function decode(
  urlOf: (cache: number) => string,
  o: RunOptions,
  report: RunReport,
  ref: Reference,
  layout: Layout,
  ids: string[],
): Promise<void> {
  const s = report.shape;
  const job = (client: number, first: number, warmup: number, full: number[]): DecodeJob => ({
    url: urlOf(client * s.layers),
    headers: o.headers,
    client: report.client,
    shape: s,
    layout,
    seed: o.seed,
    caches: Array.from({ length: s.layers }, (_, l) => client * s.layers + l)
      .map((index) => ({ index, id: ids[index] })),
    first_step: first,
    steps: s.steps,
    warmup,
    check_rows: o.check_rows,
    full_steps: full,
  });
  const warmup = report.decode_warmup_calls = Math.max(1, o.warmup_calls);
  const ticks = () => allPollTicks(report.urls, o.headers);
  const t0 = await ticks();
  // The servers' CPU over each timed phase, its warm-ups left out (bench/http_server_cpu.ts).
  const seqCpu = new CpuBracket(report.urls, o.headers);
  const seq = await runDecode(job(0, 0, warmup, [0, s.steps - 1]), () => seqCpu.start());
  report.server_cpu = { sequential: await seqCpu.end(seq.calls.length), concurrent: null };
  report.decode_cold_ms = seq.warmup_ms;
  if (seq.calls.length) report.decode_sequential = phaseStats(seq.calls);
  if (seq.error) report.errors.push(seq.error);
  o.log(`decode sequential: ${seq.calls.length} calls, p50 ${report.decode_sequential?.p50_ms} ms`);
  const t1 = await ticks();
  let conc: DecodeCall[] = [];
  if (!seq.error) {
    const last = s.clients - 1;
    const jobs = Array.from(
      { length: s.clients },
      // Each client warms up on its own requests before the start barrier (not timed).
      (_, c) =>
        job(
          c,
          c === 0 ? s.steps : 0,
          warmup,
          c === last && c > 0 ? [s.steps - 1] : [],
        ),
    );
    const concCpu = new CpuBracket(report.urls, o.headers);
    const { results, wall_ms } = await concurrently(jobs, () => concCpu.start());
    conc = results.flatMap((r) => r.calls);
    report.server_cpu.concurrent = await concCpu.end(conc.length, wall_ms);
    for (const r of results) if (r.error) report.errors.push(r.error);
    if (conc.length) report.decode_concurrent = phaseStats(conc, wall_ms);
    o.log(`decode ${jobs.length} clients: ${conc.length} calls in ${wall_ms.toFixed(0)} ms`);
  }
  if (t0) {
    report.dawn_poll = {
      sequential: ticksBetween(t0, t1),
      concurrent: ticksBetween(t1, await ticks()),
    };
  }
  report.backends.decode = uniq([...seq.calls, ...conc].map((c) => c.backend));
  report.checks.decode = checkDecode(ref, [...seq.calls, ...conc]);
}
