/** bench/plot.ts: one bar per measured row, its length the ratio to the same-run yardstick. */
import assert from "node:assert/strict";
import { plotSvg } from "../../bench/plot.ts";

Deno.test("plot: bars scale with the ratio to the yardstick; skipped rows are left out", () => {
  const svg = plotSvg([
    { case: "prefill 4x1024", backend: "WEBGPU_FLASH", tflops: 10, x_fma: 0.5 },
    { case: "decode 32x2048", backend: "WEBGPU_DECODE", kv_gbps: 3000, x_copy: 1 },
    { case: "decode 32x2048", backend: "CPU_REFERENCE", skipped: "host backend" },
  ], { adapter: "GPU <x>", runtime: "dawn", copyGbps: 3000, fmaTflops: 20 });
  const widths = [...svg.matchAll(/<rect x="\d+" y="[\d.]+" width="([\d.]+)"/g)].map((m) =>
    Number(m[1])
  );
  assert.equal(widths.length, 2, "two bars");
  assert.ok(Math.abs(widths[0] / widths[1] - 0.5) < 1e-6, `${widths}`);
  assert.match(svg, /10\.00 TFLOP\/s/);
  assert.match(svg, /3000 GB\/s/);
  assert.match(svg, /GPU &lt;x&gt; \(dawn\)/, "text is escaped");
  assert.ok(!svg.includes("CPU_REFERENCE"));
});
