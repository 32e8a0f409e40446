/**
 * bench/anchor.ts: bench/torch_anchor.py's JSON read into SDPA entries, matched to bench shapes,
 * `x SDPA` = SDPA ms / our device ms and its text; the table's `x SDPA` and mixed-parts columns
 * (bench/report_text.ts); `deno task bench --anchor` / BENCH_ANCHOR refusing a bad file before
 * any device is touched.
 */
import assert from "node:assert/strict";
import { anchorFor, anchorLegend, parseAnchor, xSdpa } from "../../bench/anchor.ts";
import { benchShapes, shapeName } from "../../bench/shapes.ts";
import { partsText, table, xSdpaText } from "../../bench/report_text.ts";
import type { BackendRow } from "../../bench/measure.ts";

const SHAPE = (kind: string, reqs: number, ctx: number, qlen: number) => ({
  kind,
  reqs,
  ctx,
  qlen,
  num_heads: 32,
  num_kv_heads: 8,
  head_size: 128,
});

/** What `python3 bench/torch_anchor.py --json FILE` writes (made-up times). */
const ANCHOR = JSON.stringify({
  device: "NVIDIA H100 80GB HBM3",
  torch: "2.5.1",
  rows: [
    { case: "copy 2GiB", ms: 1.6, "GB/s": 2700 },
    {
      case: "decode sdpa contiguous 32x2048",
      ms: 0.08,
      "GB/s": 3350,
      shape: SHAPE("decode", 32, 2048, 1),
    },
    { case: "decode page gather (K only) 32x2048", ms: 0.2, "GB/s": 1300 },
    {
      case: "prefill sdpa causal 4x1024",
      ms: 0.25,
      "TFLOP/s": 275,
      shape: SHAPE("prefill", 4, 1024, 1024),
    },
  ],
});

Deno.test("anchor: SDPA rows by their shape; the copy and the page gather anchor nothing", () => {
  const a = parseAnchor(ANCHOR);
  assert.equal(a.device, "NVIDIA H100 80GB HBM3");
  assert.equal(a.torch, "2.5.1");
  assert.deepEqual(a.entries.map((e) => [e.case, e.kind, e.reqs, e.ctx, e.qlen, e.ms]), [
    ["decode sdpa contiguous 32x2048", "decode", 32, 2048, 1, 0.08],
    ["prefill sdpa causal 4x1024", "prefill", 4, 1024, 1024, 0.25],
  ]);
  assert.match(anchorLegend(a, "anchor.json"), /SDPA ms \/ our device ms.*above 1 ours is faster/);
});

Deno.test("anchor: rows written before `shape` are read from their case names", () => {
  const a = parseAnchor(JSON.stringify({
    device: "NVIDIA H200",
    rows: [
      { case: "decode sdpa contiguous 64x8192", ms: 1.1 },
      { case: "prefill sdpa causal 8x4096", ms: 4.5 },
      { case: "decode page gather (K only) 64x8192", ms: 2 },
    ],
  }));
  assert.equal(a.torch, undefined);
  assert.deepEqual(a.entries.map((e) => [e.kind, e.reqs, e.ctx, e.qlen, e.num_heads, e.ms]), [
    ["decode", 64, 8192, 1, 32, 1.1],
    ["prefill", 8, 4096, 4096, 32, 4.5],
  ]);
});

Deno.test("anchor: malformed documents and rows are refused with the reason", () => {
  assert.throws(() => parseAnchor("torch 2.5 NVIDIA H100"), /anchor: not JSON/);
  assert.throws(() => parseAnchor('{"device": "x"}'), /expected \{"device"/);
  assert.throws(() => parseAnchor('{"rows": [3]}'), /rows\[0\] is not an object/);
  const row = (r: Record<string, unknown>) => parseAnchor(JSON.stringify({ rows: [r] }));
  assert.throws(
    () => row({ case: "decode sdpa contiguous 32x2048", ms: "fast" }),
    /decode sdpa contiguous 32x2048: ms must be a positive number/,
  );
  assert.throws(() => row({ case: "x", ms: 1, shape: { ...SHAPE("decode", 32, 0, 1) } }), /ctx/);
  assert.throws(() => row({ case: "x", ms: 1, shape: SHAPE("mixed", 1, 1, 1) }), /kind "mixed"/);
  assert.equal(parseAnchor('{"rows": []}').device, "(unknown device)");
});

Deno.test("anchor: bench shapes it measured match; other caches, sizes and mixed do not", () => {
  const a = parseAnchor(ANCHOR);
  const found = benchShapes(false, true).map((s) => [shapeName(s), anchorFor(a, s)?.ms ?? null]);
  assert.deepEqual(found, [
    ["decode 32x2048 32q/8kv d128 bs16 f16", 0.08],
    ["decode 64x8192 32q/8kv d128 bs16 f16", null],
    ["decode 32x2048 32q/8kv d128 bs16 f16 data, bfloat16 cache", null],
    ["decode 32x2048 32q/8kv d128 bs16 f16 data, fp8_e4m3 cache", null],
    // SDPA reads contiguous K/V: our cache layout is not part of the match.
    ["decode 32x2048 32q/8kv d128 bs16 f16 HND", 0.08],
    ["decode 64x8192 32q/8kv d128 bs16 f16 HND", null],
    ["prefill 4x1024 causal 32q/8kv d128 bs16 f16", 0.25],
    ["prefill 8x4096 causal 32q/8kv d128 bs16 f16", null],
    ["mixed 32x2048 + 2x512/1536 32q/8kv d128 bs16 f16", null],
  ]);
  // The small shapes have other head counts: nothing.
  assert.ok(benchShapes(true).every((s) => anchorFor(a, s) === null));
});

Deno.test("x SDPA: SDPA's ms over ours (above 1: ours faster), '-' where either is missing", () => {
  assert.ok(Math.abs(xSdpa(0.08, 0.1)! - 0.8) < 1e-12, "SDPA faster: below 1");
  assert.ok(Math.abs(xSdpa(0.3, 0.1)! - 3) < 1e-12, "ours faster: above 1");
  const none: [number | null | undefined, number | undefined][] = [
    [null, 0.1],
    [undefined, 0.1],
    [0.08, undefined],
    [0.08, 0],
    [0, 1],
  ];
  for (const [s, d] of none) {
    assert.equal(xSdpa(s, d), null, `${s} / ${d}`);
  }
  assert.deepEqual(
    [0.8, 3.0000001, 0.01234, 123.4, null, undefined, NaN].map(xSdpaText),
    ["0.800", "3.00", "0.0123", "123", "-", "-", "-"],
  );
});

const ROWS: BackendRow[] = [
  {
    case: "decode 32x2048",
    backend: "WEBGPU_FLASH",
    device_ms: 0.1,
    kv_gbps: 2680,
    x_copy: 0.9,
    e2e_ms: 0.5,
    sdpa_ms: 0.08,
    x_sdpa: 0.8,
    x_sdpa_stream: 0.9,
  },
  { case: "decode 32x2048", backend: "CPU_REFERENCE", skipped: "host backend" },
  {
    case: "mixed 32x2048 + 2x512/1536",
    backend: "WEBGPU_FLASH",
    device_ms: 0.6,
    device_parts: { decode_ms: 0.1, prefill_ms: 0.5 },
    e2e_ms: 1.5,
    sdpa_ms: null,
    x_sdpa: null,
  },
  {
    case: "mixed 32x2048 + 2x512/1536",
    backend: "WEBGPU_DECODE",
    device_ms: 0.9,
    device_parts: null,
    e2e_ms: 1.9,
    max_diff: 0.001,
    sdpa_ms: null,
    x_sdpa: null,
  },
];

Deno.test("table: x SDPA and stream columns with an anchor, '-' where it lacks the shape; mixed parts", () => {
  const cells = (l: string) => l.split(/\s{2,}/);
  const [head, ...body] = table(ROWS, { sdpa: true });
  assert.deepEqual(cells(head), [
    "case",
    "backend",
    "device ms",
    "decode + prefill ms",
    "TFLOP/s",
    "xFMA",
    "KV GB/s",
    "xcopy",
    "x SDPA",
    "stream",
    "e2e ms",
    "max diff",
    "cold plan/run ms",
  ]);
  assert.equal(body.length, 3, "the skipped row left out");
  const col = (name: string) => body.map((l) => cells(l)[cells(head).indexOf(name)]);
  assert.deepEqual(col("x SDPA"), ["0.800", "-", "-"]);
  assert.deepEqual(col("stream"), ["0.900", "-", "-"]);
  assert.deepEqual(col("decode + prefill ms"), ["-", "0.100 + 0.500", "together"]);
  assert.deepEqual(ROWS.map(partsText), ["-", "-", "0.100 + 0.500", "together"]);
  // No anchor, no mixed rows: the columns as before.
  const plain = table(ROWS.slice(0, 2));
  assert.ok(!plain[0].includes("x SDPA") && !plain[0].includes("decode + prefill"), plain[0]);
  assert.equal(cells(plain[0]).length, 10);
});

Deno.test("bench --anchor / BENCH_ANCHOR: a bad file fails at once, before any device", async () => {
  const dir = await Deno.makeTempDir({ dir: "/tmp" });
  try {
    const bad = `${dir}/anchor.json`;
    await Deno.writeTextFile(bad, "torch 2.5.1 NVIDIA H100\n");
    const main = new URL("../../bench/main.ts", import.meta.url).pathname;
    const run = async (args: string[], env: Record<string, string> = {}) => {
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["run", "--allow-read", "--allow-env", "--allow-net", "--allow-ffi", main, ...args],
        env,
        stdout: "piped",
        stderr: "piped",
      }).output();
      return { code: out.code, err: new TextDecoder().decode(out.stderr) };
    };
    const a = await run(["--anchor", bad]);
    assert.equal(a.code, 2, a.err);
    assert.match(a.err, new RegExp(`--anchor ${bad}: anchor: not JSON`));
    const b = await run([], { BENCH_ANCHOR: `${dir}/missing.json` });
    assert.equal(b.code, 2, b.err);
    assert.match(b.err, /--anchor .*missing\.json: .*No such file/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
