/**
 * The prefill phase of an HTTP bench run (bench/http_run.ts): fills every cache by prefill
 * calls, cache 0's timed alone and the same call on the other caches sent together, and checks
 * the answers after the clock.
 * @module
 */
import { prefillBody } from "./http_bodies.ts";
import { addTally, checkPrefill, type PrefillAnswer, prefillCheckCost } from "./http_checks.ts";
import { type Caller, caller, forward, sampleRows, takeRows } from "./http_client.ts";
import type { Reference } from "./http_reference.ts";
import { phaseStats, type Timed } from "./http_stats.ts";
import { type Chunk, chunkQuery, chunksOf, type Layout, seedOf } from "./http_workload.ts";
import type { RunOptions, RunReport } from "./http_run_types.ts";
import { uniq } from "./uniq.ts";

/**
 * Fills every cache by prefill calls. Cache 0 gets each chunk alone and timed (chunk 0 once
 * more before, untimed: the cold call); the other caches get the same chunk `clients` at a time
 * (one caller a cache, to its instance: a raw connection carries one call at a time).
 */
export async function prefill(
  urlOf: (cache: number) => string,
  o: RunOptions,
  report: RunReport,
  ref: Reference,
  layout: Layout,
  ids: string[],
): Promise<void> {
  const s = report.shape;
  const callers = ids.map((_, c) => caller(report.client, urlOf(c), o.headers));
  const acc: PrefillAcc = { seq: [], fill: [], backends: [], fillWall: 0 };
  try {
    for (const c of chunksOf(s)) {
      await prefillChunk(c, { o, report, ref, layout, ids, callers }, acc);
    }
  } finally {
    for (const c of callers) c.close();
  }
  if (acc.seq.length) report.prefill = phaseStats(acc.seq);
  if (acc.fill.length) report.prefill_fill = phaseStats(acc.fill, acc.fillWall);
  report.backends.prefill = uniq(acc.backends);
}

/** What the prefill calls gathered. */
interface PrefillAcc {
  seq: Timed[];
  fill: Timed[];
  backends: string[];
  fillWall: number;
}

/** One prefill chunk on every cache, its answers checked (after the clock). */
async function prefillChunk(
  c: Chunk,
  x: {
    o: RunOptions;
    report: RunReport;
    ref: Reference;
    layout: Layout;
    ids: string[];
    /** One a cache. */
    callers: Caller[];
  },
  acc: PrefillAcc,
): Promise<void> {
  const { o, report, ref, ids, callers } = x, s = report.shape, D = s.head_size;
  const q = chunkQuery(s, o.seed, c);
  const rows = sampleRows(
    c.n * c.len * s.num_heads,
    o.prefill_check_rows,
    seedOf(o.seed, "prows", c.index),
  );
  const full0 = c.index === 0 && prefillCheckCost(ref, c) <= o.full_prefill_limit;
  const keep = (cache: number, out: Uint16Array, full: boolean): PrefillAnswer => ({
    cache,
    full,
    values: full ? out : takeRows(out, rows, D),
  });
  const body = (cache: number, via: Caller) =>
    via.prepare(prefillBody(s, x.layout, ids[cache], c, q, ref.ctxK, ref.ctxV));
  if (c.index === 0) report.prefill_cold_ms = (await forward(callers[0], body(0, callers[0]))).ms;
  const a0 = await forward(callers[0], body(0, callers[0]));
  acc.seq.push(a0);
  acc.backends.push(a0.backend);
  const answers = [keep(0, a0.output, full0)];
  for (let first = 1; first < ids.length; first += s.clients) {
    const group = ids.slice(first, first + s.clients).map((_, i) => first + i);
    const requests = group.map((cache) => body(cache, callers[cache]));
    const t0 = performance.now();
    const got = await Promise.all(requests.map((r, i) => forward(callers[group[i]], r)));
    acc.fillWall += performance.now() - t0;
    got.forEach((a, i) => {
      acc.fill.push(a);
      acc.backends.push(a.backend);
      answers.push(keep(group[i], a.output, false));
    });
  }
  addTally(report.checks.prefill, checkPrefill(ref, c, q, rows, answers));
  o.log(
    `prefill chunk ${c.index}: requests ${c.r0}..${c.r0 + c.n - 1}, positions ` +
      `${c.p0}..${c.p0 + c.len - 1}: ${a0.ms.toFixed(1)} ms (server total ` +
      `${a0.timings.total?.toFixed(1)} ms)`,
  );
}
