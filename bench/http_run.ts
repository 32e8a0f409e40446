/**
 * One HTTP bench run against one server (at `url`), or against several instances of it (each
 * its own process and device, as behind the nginx front of deploy/: client c's caches and
 * calls all go to instance c mod N, the way `X-Attention-Instance` pins a cache to its
 * instance), like a model runner: read `/v1/device` of the first (software adapter → small
 * shapes unless told otherwise), create one server-held f16 cache per client and layer, fill
 * them by prefill calls (cache 0's calls one at a time and timed alone; the same call on the
 * other caches sent together), then timed decode steps: client 0 alone (sequential: p50/p99),
 * then every client at once from its own worker on its own caches (calls/s). Every answer is
 * checked after the clock stops (bench/http_checks.ts).
 * @module
 */
import { AttentionClient } from "../client/client.ts";
import type { DeviceReport } from "../core/types.ts";
import { prefillBody } from "./http_bodies.ts";
import {
  addTally,
  checkDecode,
  checkPrefill,
  type CheckTally,
  type PrefillAnswer,
  prefillCheckCost,
  tally,
} from "./http_checks.ts";
import {
  type Caller,
  caller,
  type ClientKind,
  type DecodeCall,
  type DecodeJob,
  forward,
  runDecode,
  sampleRows,
  takeRows,
} from "./http_client.ts";
import { concurrently } from "./http_clients.ts";
import { type PollTicks, serverPollTicks, ticksBetween } from "./http_dawn_poll.ts";
import { Reference } from "./http_reference.ts";
import { type PhaseStats, phaseStats, type Timed } from "./http_stats.ts";
import {
  BIG_SHAPE,
  cacheBytes,
  type Chunk,
  chunkQuery,
  chunksOf,
  type HttpShape,
  type Layout,
  layoutOf,
  seedOf,
  SMALL_SHAPE,
} from "./http_workload.ts";

/** How to run. */
export interface RunOptions {
  /** "auto": small on a software adapter or without a device. */
  size: "auto" | "small" | "big";
  /** Overrides of the chosen shape. */
  shape: Partial<HttpShape>;
  seed: number;
  /** Rows (token, head) checked per decode answer and per prefill answer. */
  check_rows: number;
  prefill_check_rows: number;
  /** Check a prefill chunk's whole answer when it costs at most this many multiply-adds. */
  full_prefill_limit: number;
  /**
   * Untimed decode calls before the sequential timed ones (at least 1: the cold call): the
   * server's JavaScript reaches its optimized tiers only after some hundred calls, which an
   * engine's server is past (in process on the dev VM, a decode step's validate 0.13 ms in the
   * first 200 calls, 0.05 in 1,500). 1 is the protocol before v0.7.
   */
  warmup_calls: number;
  /** Extra request headers (e.g. authorization). */
  headers: Record<string, string>;
  /** How the clients talk HTTP (default "raw": the bench's own keep-alive connection). */
  client?: ClientKind;
  log: (line: string) => void;
}

/** What one run measured and checked. */
export interface RunReport {
  url: string;
  /** Every instance's URL (`url` is the first); client c uses instance c mod N. */
  urls: string[];
  /** The bench's HTTP client (bench/http_client.ts). */
  client: ClientKind;
  device: DeviceReport;
  software: boolean;
  small: boolean;
  shape: HttpShape;
  cache?: { backend: string; storage: string; bytes: number; count: number };
  /** The server backends that answered, per phase. */
  backends: Record<string, string[]>;
  /** Round trip of the first call of each kind (untimed otherwise: cold pipelines). */
  prefill_cold_ms?: number;
  decode_cold_ms?: number;
  /** Untimed decode calls before the sequential timed ones (the first: the cold call). */
  decode_warmup_calls?: number;
  prefill?: PhaseStats;
  /** The same prefill calls on the other clients' caches, sent together. */
  prefill_fill?: PhaseStats;
  decode_sequential?: PhaseStats;
  decode_concurrent?: PhaseStats;
  /**
   * The servers' Dawn poll ticks (summed over instances) during the timed decode phases,
   * where /metrics has them (bench/http_dawn_poll.ts).
   */
  dawn_poll?: { sequential: PollTicks | null; concurrent: PollTicks | null };
  checks: { prefill: CheckTally; decode: CheckTally };
  /** The server's keep-warm state after the run (`/v1/device`), when it was asked for. */
  keep_warm?: DeviceReport["keep_warm"];
  errors: string[];
  ok: boolean;
}

const SOFTWARE = /llvmpipe|lavapipe|swiftshader|softpipe/i;

/** Is this report's adapter a software one (or is there no device)? */
export function isSoftware(d: DeviceReport): boolean {
  return !d.available || d.adapter?.is_fallback_adapter === true ||
    SOFTWARE.test(`${d.adapter?.description ?? ""} ${d.adapter?.device ?? ""}`);
}

/** Checks a shape's fields; throws naming the bad one. */
export function checkShape(s: HttpShape): void {
  for (const [k, v] of Object.entries(s)) {
    if (!Number.isSafeInteger(v) || v < 1) {
      throw new Error(`${k} must be a positive integer, got ${v}`);
    }
  }
  if (s.num_heads % s.num_kv_heads) {
    throw new Error(`num_heads ${s.num_heads} is not a multiple of num_kv_heads ${s.num_kv_heads}`);
  }
}

const uniq = (xs: string[]) => [...new Set(xs)];

/**
 * Runs the bench against the server at `url`, or against the instances at `url[0..N-1]` (client
 * c's caches and calls on instance c mod N).
 */
export async function runOnServer(url: string | string[], o: RunOptions): Promise<RunReport> {
  const urls = typeof url === "string" ? [url] : url;
  if (urls.length === 0) throw new Error("runOnServer: no server URL");
  const apis = urls.map((u) => new AttentionClient(u, { headers: o.headers }));
  const api = apis[0];
  const device = await api.device();
  const software = isSoftware(device);
  const small = o.size === "small" || (o.size === "auto" && software);
  const shape = { ...(small ? SMALL_SHAPE : BIG_SHAPE), ...o.shape };
  checkShape(shape);
  const report: RunReport = {
    url: urls[0],
    urls,
    client: o.client ?? "raw",
    device,
    software,
    small,
    shape,
    backends: {},
    checks: { prefill: tally(), decode: tally() },
    errors: [],
    ok: false,
  };
  const layout = layoutOf(shape, o.seed);
  const ids: string[] = [];
  /** Cache c's instance: its client's. */
  const instance = (cache: number) => Math.floor(cache / shape.layers) % urls.length;
  try {
    for (let c = 0; c < shape.clients * shape.layers; c++) {
      const info = await apis[instance(c)].createCache({
        num_blocks: layout.num_blocks,
        block_size: shape.block_size,
        num_kv_heads: shape.num_kv_heads,
        head_size: shape.head_size,
        dtype: "float16",
        kv_cache_dtype: "auto",
      });
      ids.push(info.id);
      report.cache = { ...pick(info), count: ids.length };
    }
    o.log(
      `caches: ${ids.length} x ${(cacheBytes(shape, layout) / 2 ** 20).toFixed(1)} MiB ` +
        `(${report.cache?.backend}, ${report.cache?.storage})`,
    );
    const ref = new Reference(shape, o.seed);
    const urlOf = (cache: number) => urls[instance(cache)];
    await prefill(urlOf, o, report, ref, layout, ids);
    if (report.errors.length === 0) await decode(urlOf, o, report, ref, layout, ids);
  } catch (e) {
    report.errors.push(e instanceof Error ? e.message : String(e));
  } finally {
    for (const [c, id] of ids.entries()) await apis[instance(c)].deleteCache(id).catch(() => {});
  }
  const kw = (await api.device().catch(() => null))?.keep_warm;
  if (kw) report.keep_warm = kw;
  const c = report.checks;
  report.ok = report.errors.length === 0 && c.prefill.failed_calls + c.decode.failed_calls === 0 &&
    c.prefill.calls + c.decode.calls > 0;
  return report;
}

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

const pick = (i: { backend: string; storage: string; bytes: number }) => ({
  backend: i.backend,
  storage: i.storage,
  bytes: i.bytes,
});

/**
 * Fills every cache by prefill calls. Cache 0 gets each chunk alone and timed (chunk 0 once
 * more before, untimed: the cold call); the other caches get the same chunk `clients` at a time
 * (one caller a cache, to its instance: a raw connection carries one call at a time).
 */
async function prefill(
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

/**
 * Decode: client 0 alone on its caches (steps 0..steps-1 after `warmup_calls` untimed calls,
 * the first of them step 0's: the cold call), then every client at once (client 0 continuing
 * from step `steps`), each from its own worker, each after as many untimed calls of its own
 * made before the start (a worker's JIT starts cold: without them the 8-client phase timed
 * the clients' unoptimized code too).
 */
async function decode(
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
  const seq = await runDecode(job(0, 0, warmup, [0, s.steps - 1]));
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
    const { results, wall_ms } = await concurrently(jobs);
    conc = results.flatMap((r) => r.calls);
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
