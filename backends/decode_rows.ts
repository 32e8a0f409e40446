/**
 * The decode rows of a batch and their order (backends/decode_plan.ts plans them): each query
 * token of the chosen requests with its visible key range ({@link keyRange}), grouped `wg_tokens`
 * to a workgroup ({@link tokenGroups}) and each request's longest groups first
 * ({@link longestFirst}).
 * @module
 */
import type { BatchShape } from "../core/types.ts";

/** A token's visible key range [begin, end) at position `p` of a request with `S` keys. */
export function keyRange(s: BatchShape, p: number, S: number): [number, number] {
  const L = s.layer, w = L.sliding_window;
  const causal = L.causal && L.attn_type !== "encoder_decoder";
  if (causal) return [w === null ? 0 : Math.max(0, p - w + 1), Math.min(S, p + 1)];
  if (w === null) return [0, S];
  return [Math.max(0, p - w + 1), Math.min(S, p + w)];
}

/** The decode rows of a batch: request, token, visible key range and position of each. */
export interface RowRanges {
  count: number;
  req: number[];
  token: number[];
  begin: number[];
  end: number[];
  pos: number[];
}

/**
 * The rows in workgroup order for `wt` token items a workgroup (tuning `wg_tokens`): each
 * request's rows in groups of `wt`, its last group padded by repeating its last row (that row's
 * output is then written twice, the same values); null when `wt` is 1, when a request has
 * fewer than `wt` rows (a decode row beside prefill chunks: its one row would run `wt` times as
 * long, which made a mixed batch 6-15% slower on an H100, bench/NOTES.md v0.22) or when the
 * padding would add over a quarter of the rows.
 */
export function tokenGroups(rows: { count: number; req: number[] }, wt: number): number[] | null {
  if (wt <= 1) return null;
  const order: number[] = [];
  for (let r = 0; r < rows.count;) {
    let e = r;
    while (e < rows.count && rows.req[e] === rows.req[r]) e++;
    if (e - r < wt) return null;
    for (let j = r; j < e; j++) order.push(j);
    while ((order.length % wt) !== 0) order.push(e - 1);
    r = e;
  }
  return order.length * 4 <= rows.count * 5 ? order : null;
}

/**
 * `order` (rows in workgroup order, `wt` to a group, each group's rows of one request) with each
 * request's groups sorted from the longest key span to the shortest, stably; requests keep
 * their places. A causal prefill's rows ascend in length, so in the order they came its longest
 * rows end the dispatch, a last wave of long workgroups beside idle compute units; longest
 * first, the short rows fill in behind them (LPT scheduling). Requests stay contiguous, so the
 * workgroups in flight still read one request's keys (L2).
 */
export function longestFirst(
  order: readonly number[],
  wt: number,
  req: readonly number[],
  span: readonly number[],
): number[] {
  const out: number[] = [];
  for (let g = 0; g < order.length;) {
    let e = g;
    while (e < order.length && req[order[e]] === req[order[g]]) e += wt;
    const groups: { rows: readonly number[]; longest: number }[] = [];
    for (let x = g; x < e; x += wt) {
      const rows = order.slice(x, x + wt);
      groups.push({ rows, longest: Math.max(...rows.map((r) => span[r])) });
    }
    groups.sort((a, b) => b.longest - a.longest);
    for (const grp of groups) out.push(...grp.rows);
    g = e;
  }
  return out;
}

/** Whether some request has several of `rows` (a prefill chunk: more than one row). */
export const severalRows = (rows: { count: number; req: number[] }) =>
  rows.req.some((i, r) => r > 0 && rows.req[r - 1] === i);

/** Every query token of the requests `reqs` selects, as a decode row (see the module doc). */
export function decodeRowRanges(s: BatchShape, reqs: (i: number) => boolean): RowRanges {
  const md = s.metadata, qsl = md.query_start_loc;
  const req: number[] = [], token: number[] = [], begin: number[] = [], end: number[] = [];
  const pos: number[] = [];
  let r = 0;
  for (let i = 0; i < md.num_reqs; i++) {
    if (!reqs(i)) continue;
    const q0 = qsl[i], n = qsl[i + 1] - q0, S = md.seq_lens[i];
    const base = S - n; // position of the request's first query (reference semantics)
    for (let j = 0; j < n; j++, r++) {
      const [b, e] = keyRange(s, base + j, S);
      req.push(i);
      token.push(q0 + j);
      begin.push(b);
      end.push(Math.max(b, e));
      pos.push(base + j);
    }
  }
  return { count: r, req, token, begin, end, pos };
}
