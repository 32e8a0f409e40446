/**
 * The bench's text output: numbers at three significant digits, the results table, a decode
 * row's device-time breakdown (bench/device_time.ts) and a mixed row's parts for its log line.
 * @module
 */
import type { BackendRow } from "./measure.ts";

/** Three significant digits (more for big numbers), "-" for none. */
export const f = (x: number | null | undefined) =>
  x === undefined || x === null ? "-" : Math.abs(x) >= 100 ? x.toFixed(0) : x.toPrecision(3);

/** `x SDPA` (bench/anchor.ts) as the table prints it: like {@link f}, "-" where there is none. */
export function xSdpaText(x: number | null | undefined): string {
  return x === null || x === undefined || !Number.isFinite(x) ? "-" : f(x);
}

/**
 * A mixed row's device ms per part, `decode + prefill` ("together" where the same passes ran
 * both); "-" on other rows.
 */
export function partsText(row: BackendRow): string {
  const p = row.device_parts;
  if (p === undefined) return "-";
  return p === null ? "together" : `${f(p.decode_ms)} + ${f(p.prefill_ms)}`;
}

/** What {@link table} adds. */
export interface TableOptions {
  /**
   * `x SDPA` and `stream` columns (SDPA ms / device ms, and / the repetitions' one-pass ms;
   * bench/anchor.ts): when an anchor was given.
   */
  sdpa?: boolean;
}

/**
 * The results table: one line a measured row, skipped rows left out; a `decode + prefill ms`
 * column when a row has parts (mixed shapes), an `x SDPA` column with `o.sdpa` ("-" where the
 * anchor lacks the shape).
 */
export function table(rows: BackendRow[], o: TableOptions = {}): string[] {
  const done = rows.filter((r) => !r.skipped);
  const parts = done.some((r) => r.device_parts !== undefined);
  type Col = [string, (r: BackendRow) => string];
  const cols: Col[] = [
    ["case", (r) => r.case],
    ["backend", (r) => r.backend],
    ["device ms", (r) => f(r.device_ms)],
    ...(parts ? [["decode + prefill ms", partsText] as Col] : []),
    ["TFLOP/s", (r) => f(r.tflops)],
    ["xFMA", (r) => f(r.x_fma)],
    ["KV GB/s", (r) => f(r.kv_gbps)],
    ["xcopy", (r) => f(r.x_copy)],
    ...(o.sdpa
      ? [
        ["x SDPA", (r) => xSdpaText(r.x_sdpa)] as Col,
        ["stream", (r) => xSdpaText(r.x_sdpa_stream)] as Col,
      ]
      : []),
    ["e2e ms", (r) => f(r.e2e_ms)],
    ["max diff", (r) => r.max_diff === undefined ? "ref" : f(r.max_diff)],
    ["cold plan/run ms", (r) => `${f(r.plan_cold_ms)}/${f(r.first_run_ms)}`],
  ];
  const head = cols.map(([h]) => h);
  const body = done.map((r) => cols.map(([, c]) => c(r)));
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => r[i].length)));
  const line = (r: string[]) =>
    r.map((c, i) => i < 2 ? c.padEnd(widths[i]) : c.padStart(widths[i])).join("  ");
  return [line(head), ...body.map(line)];
}

/** The device-time breakdown of a row (bench/device_time.ts), for its log line. */
export function breakdownText(row: BackendRow): string {
  const b = row.device_breakdown;
  if (!b) return "no breakdown";
  const res = b.resident_peak === undefined
    ? ""
    : `, resident peak ${b.resident_peak} of ${b.resident_total} split workgroups`;
  return `one pass ${f(b.one_pass)}, first call one pass ${f(b.first_one_pass)}, ` +
    `poison pass ${f(b.poison_pass)}${res}`;
}
