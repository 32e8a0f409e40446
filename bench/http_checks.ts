/**
 * Checks the HTTP bench's answers against bench/http_reference.ts after the clock stops: the
 * sampled rows of every decode answer (and the whole output of the fully kept ones), and the
 * sampled rows of every prefill answer (the whole output too where that is cheap). Counts what
 * was checked, so the report can say which fraction of the rows it compared.
 * @module
 */
import type { DecodeCall } from "./http_client.ts";
import { attendRow, firstMismatch, type Reference } from "./http_reference.ts";
import type { Chunk } from "./http_workload.ts";

/** What a phase's checks covered and found. */
export interface CheckTally {
  /** Answers checked (every answer of the phase). */
  calls: number;
  /** Of them, checked in full. */
  full_calls: number;
  /** (token, head) rows compared, and rows the answers held. */
  rows_checked: number;
  rows_total: number;
  failed_calls: number;
  /** The first few failures, each naming the call, row, element and both values. */
  failures: string[];
}

/** An empty tally. */
export function tally(): CheckTally {
  return { calls: 0, full_calls: 0, rows_checked: 0, rows_total: 0, failed_calls: 0, failures: [] };
}

/** Adds b into a. */
export function addTally(a: CheckTally, b: CheckTally): CheckTally {
  a.calls += b.calls;
  a.full_calls += b.full_calls;
  a.rows_checked += b.rows_checked;
  a.rows_total += b.rows_total;
  a.failed_calls += b.failed_calls;
  a.failures.push(...b.failures.slice(0, Math.max(0, 5 - a.failures.length)));
  return a;
}

const fmt = (x: number) => Number.isFinite(x) ? x.toPrecision(6) : String(x);

function record(t: CheckTally, what: string, bad: string | null) {
  t.calls++;
  if (bad === null) return;
  t.failed_calls++;
  if (t.failures.length < 5) t.failures.push(`${what}: ${bad}`);
}

/**
 * Checks decode answers (any order, any caches): each call's kept rows, or all rows when it
 * kept the whole output. Regenerates each cache's steps once, in order.
 */
export function checkDecode(ref: Reference, calls: DecodeCall[]): CheckTally {
  const s = ref.shape, H = s.num_heads, D = s.head_size, group = H / s.num_kv_heads;
  const t = tally();
  const byCache = Map.groupBy(calls, (c) => c.cache);
  for (const [cache, list] of byCache) {
    for (const c of list.toSorted((a, b) => a.step - b.step)) {
      const q = ref.decodeStep(cache, c.step);
      const rows = c.full ? Array.from({ length: s.reqs * H }, (_, i) => i) : c.rows;
      const got = c.full ?? c.values;
      let bad: string | null = null, i = 0;
      for (; i < rows.length && !bad; i++) {
        const row = rows[i], r = Math.floor(row / H), h = row % H, g = Math.floor(h / group);
        const want = attendRow(s, ref.source(r, cache), r, g, q, row * D, s.ctx + c.step + 1);
        const m = firstMismatch(got, (c.full ? row : i) * D, want);
        if (m) {
          bad = `request ${r}, head ${h}, element ${m.d}: got ${fmt(m.got)}, want ${fmt(m.want)}`;
        }
      }
      t.rows_checked += i;
      t.rows_total += s.reqs * H;
      if (c.full) t.full_calls++;
      record(t, `decode cache ${cache} step ${c.step}${c.full ? " (full)" : ""}`, bad);
    }
    ref.forget(cache);
  }
  return t;
}

/** One prefill answer to check: the output rows kept (or the whole output), by cache. */
export interface PrefillAnswer {
  cache: number;
  /** f16 bits: rows.length x D, or the whole [T, H, D] output when `full`. */
  values: Uint16Array;
  full: boolean;
}

/**
 * Checks the answers of one prefill chunk (the same call on several caches): `rows` (flat
 * token * H + head) against float64 values computed once; full answers over every row.
 */
export function checkPrefill(
  ref: Reference,
  c: Chunk,
  q: Uint16Array,
  rows: number[],
  answers: PrefillAnswer[],
): CheckTally {
  const s = ref.shape, H = s.num_heads, D = s.head_size, group = H / s.num_kv_heads;
  const T = c.n * c.len;
  const memo = new Map<number, Float64Array>();
  const want = (row: number) => {
    let w = memo.get(row);
    if (!w) {
      const tok = Math.floor(row / H), h = row % H;
      const r = c.r0 + Math.floor(tok / c.len), pos = c.p0 + tok % c.len;
      w = attendRow(s, ref.source(r, null), r, Math.floor(h / group), q, row * D, pos + 1);
      memo.set(row, w);
    }
    return w;
  };
  const t = tally();
  for (const a of answers) {
    const list = a.full ? Array.from({ length: T * H }, (_, i) => i) : rows;
    let bad: string | null = null, i = 0;
    for (; i < list.length && !bad; i++) {
      const row = list[i], m = firstMismatch(a.values, (a.full ? row : i) * D, want(row));
      if (m) {
        const tok = Math.floor(row / H);
        bad = `request ${c.r0 + Math.floor(tok / c.len)}, position ${c.p0 + tok % c.len}, ` +
          `head ${row % H}, element ${m.d}: got ${fmt(m.got)}, want ${fmt(m.want)}`;
      }
    }
    t.rows_checked += i;
    t.rows_total += T * H;
    if (a.full) t.full_calls++;
    record(t, `prefill chunk ${c.index} cache ${a.cache}${a.full ? " (full)" : ""}`, bad);
  }
  return t;
}

/** Multiply-adds of checking a whole prefill chunk (to decide whether a full check is cheap). */
export function prefillCheckCost(ref: Reference, c: Chunk): number {
  const s = ref.shape;
  return c.n * c.len * s.num_heads * s.head_size * 2 * (c.p0 + (c.len + 1) / 2);
}
