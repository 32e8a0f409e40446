/**
 * The bench's text output: numbers at three significant digits, the results table, and a decode
 * row's device-time breakdown (bench/device_time.ts) for its log line.
 * @module
 */
import type { BackendRow } from "./measure.ts";

/** Three significant digits (more for big numbers), "-" for none. */
export const f = (x: number | null | undefined) =>
  x === undefined || x === null ? "-" : Math.abs(x) >= 100 ? x.toFixed(0) : x.toPrecision(3);

/** The results table: one line a measured row, skipped rows left out. */
export function table(rows: BackendRow[]): string[] {
  const head = [
    "case",
    "backend",
    "device ms",
    "TFLOP/s",
    "xFMA",
    "KV GB/s",
    "xcopy",
    "e2e ms",
    "max diff",
    "cold plan/run ms",
  ];
  const body = rows.filter((r) => !r.skipped).map((r) => [
    r.case,
    r.backend,
    f(r.device_ms),
    f(r.tflops),
    f(r.x_fma),
    f(r.kv_gbps),
    f(r.x_copy),
    f(r.e2e_ms),
    r.max_diff === undefined ? "ref" : f(r.max_diff),
    `${f(r.plan_cold_ms)}/${f(r.first_run_ms)}`,
  ]);
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
