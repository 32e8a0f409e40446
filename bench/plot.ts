/**
 * `deno task bench --plot FILE.svg`: an SVG of each measured case beside its same-run yardstick.
 * One horizontal bar per row, its length the row's ratio to the yardstick (prefill: TFLOP/s over
 * the same-run FMA ceiling; decode: KV GB/s over the same-run copy), a line at 1.0, and the
 * absolute figure printed at the bar's end. Plain SVG text, no dependency.
 * @module
 */
import type { BackendRow } from "./measure.ts";

/** What the plot states in its title. */
export interface PlotContext {
  adapter: string;
  runtime: string;
  copyGbps: number;
  fmaTflops: number;
}

const esc = (s: string) =>
  s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

/** The SVG of `rows` (skipped rows are left out). */
export function plotSvg(rows: BackendRow[], c: PlotContext): string {
  const done = rows.filter((r) => !r.skipped && (r.x_fma ?? r.x_copy) !== undefined);
  const label = 420, bar = 360, rowH = 22, top = 56;
  const max = Math.max(1, ...done.map((r) => r.x_fma ?? r.x_copy ?? 0));
  const scale = bar / max;
  const h = top + done.length * rowH + 40;
  const w = label + bar + 170;
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" ` +
    `font-family="monospace" font-size="12">`,
    `<rect width="${w}" height="${h}" fill="white"/>`,
    `<text x="8" y="18" font-size="14">${esc(`${c.adapter} (${c.runtime})`)}</text>`,
    `<text x="8" y="36">${
      esc(
        `bars: prefill TFLOP/s / FMA ceiling ${c.fmaTflops.toFixed(1)} TFLOP/s; ` +
          `decode KV GB/s / copy ${c.copyGbps.toFixed(0)} GB/s (same run)`,
      )
    }</text>`,
  ];
  done.forEach((r, i) => {
    const y = top + i * rowH;
    const x = r.x_fma ?? r.x_copy ?? 0;
    const prefill = r.x_fma !== undefined;
    const fig = prefill
      ? `${(r.tflops ?? 0).toFixed(2)} TFLOP/s`
      : `${(r.kv_gbps ?? 0).toFixed(0)} GB/s`;
    parts.push(
      `<text x="8" y="${y + 15}">${esc(`${r.case} | ${r.backend}`.slice(0, 58))}</text>`,
      `<rect x="${label}" y="${y + 4}" width="${Math.max(1, x * scale).toFixed(1)}" ` +
        `height="${rowH - 8}" fill="${prefill ? "#4c78a8" : "#f58518"}"/>`,
      `<text x="${label + x * scale + 6}" y="${y + 15}">${esc(`${x.toFixed(3)}x  ${fig}`)}</text>`,
    );
  });
  const one = label + scale;
  parts.push(
    `<line x1="${one}" y1="${top - 4}" x2="${one}" y2="${top + done.length * rowH}" ` +
      `stroke="black" stroke-dasharray="4 3"/>`,
    `<text x="${one - 12}" y="${top + done.length * rowH + 16}">1.0</text>`,
    "</svg>",
  );
  return parts.join("\n") + "\n";
}
