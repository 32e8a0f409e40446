/**
 * `deno task bench [--runtime deno|dawn|auto] [--dawn-flags L] [--dawn-flag K=V]
 * [--case decode|prefill|mixed|all] [--small|--big] [--iters N] [--reps N] [--flash-tiles LIST]
 * [--decode-tunings JSON] [--shapes REGEX] [--hnd] [--anchor FILE] [--json]`: kernel device
 * time beside same-run yardsticks. `--shapes` (or BENCH_SHAPES) keeps the shapes whose name
 * matches; `--hnd` (or BENCH_HND=1) adds the f16 decode shapes over an HND cache; `--anchor`
 * (or BENCH_ANCHOR) reads bench/torch_anchor.py's JSON and adds `x SDPA` (SDPA's ms / our
 * device ms, above 1 ours faster; bench/anchor.ts) to each row of a shape the anchor measured.
 *
 * 1. Selects the WebGPU runtime (`--runtime`, else ATTN_WEBGPU_RUNTIME, else deno), acquires
 *    the device through `WebGpuDeviceManager` (gpu/device.ts), prints runtime and adapter
 *    and the runtime's completion round trip (empty submit + 16-byte mapAsync).
 * 2. Yardsticks, measured in the same run: bench/copy.wgsl (vec4<u32> copy, GB/s of read +
 *    write) and bench/fma.wgsl (the f32 FMA ceiling, TFLOP/s).
 * 3. For each shape (bench/shapes.ts; small on software adapters): every backend the
 *    registry's capability checks accept, plus the swept variants (bench/variants.ts: the decode
 *    tunings on the prefill shapes too, whose rows WEBGPU_DECODE runs as split-KV rows), runs
 *    bench/measure.ts: device ms of the attention kernels (timestamp-query, repetitions in one
 *    submit), TFLOP/s (prefill) or KV GB/s (decode) from it, xFMA / xcopy ratios, awaited
 *    end-to-end ms, and the largest difference from the shape's first output (CPU_REFERENCE on
 *    software adapters, else the registered WEBGPU_FLASH). Mixed shapes (decode rows and
 *    prefill chunks in one call) run the registered backends only, no swept variants.
 *
 * The parts live beside it: the flags, the anchor file, the device and the run's sizes
 * (bench/bench_setup.ts), the measurement loop over shapes and backends
 * (bench/measure_shapes.ts), the keep-warm spins through the run (bench/hold_clock.ts) and the
 * BENCH_PREFILL_CACHES / BENCH_PREFILL_GQA lists (bench/prefill_env.ts).
 * @module
 */
import { plotSvg } from "./plot.ts";
import { measureShapes } from "./measure_shapes.ts";
import { prefillCachesOf, prefillGroupsOf } from "./prefill_env.ts";
import { describeAdapter } from "../gpu/runtime_adapter.ts";
import { deviceSummary } from "../gpu/runtime_report.ts";
import { copyBench, type CopyResult } from "./copy.ts";
import { fmaBench, type FmaResult } from "./fma.ts";
import type { BackendRow } from "./measure.ts";
import { f, table } from "./report_text.ts";
import { anchorLegend } from "./anchor.ts";
import { decodeVariants, flashVariants, type Variant } from "./variants.ts";
import { holdClock } from "./hold_clock.ts";
import { benchArgs, benchDevice, type BenchRun, benchRun, readAnchor } from "./bench_setup.ts";

const USAGE = "deno task bench [--runtime deno|dawn|auto] [--dawn-flags L] [--dawn-flag K=V] " +
  "[--case decode|prefill|mixed|all] [--small|--big] [--iters N] [--reps N] " +
  "[--flash-tiles 8x8x4x4,...] [--decode-tunings JSON-array] [--shapes REGEX] [--hnd] " +
  "[--anchor torch_anchor.json] [--json] [--plot FILE.svg] " +
  "[--no-keep-warm]";

/** The runtime, round trips, adapter, features, limits and sizes. */
function logDevice(r: BenchRun): void {
  const { gpu, log, roundTrip, readTrip } = r;
  log(`runtime: ${deviceSummary(r.mgr.report())}`);
  log(`completion round trip (empty submit + 16 B mapAsync): median ${f(roundTrip)} ms`);
  log(
    `read-back round trip (16 B copy + read, as forward calls read back): median ${f(readTrip)} ms`,
  );
  log(
    `adapter: ${describeAdapter(r.info)}, DENO_WEBGPU_BACKEND=${
      Deno.env.get("DENO_WEBGPU_BACKEND") ?? "(default)"
    }`,
  );
  log(`features: ${[...gpu.features].sort().join(", ")}`);
  log(
    `maxStorageBufferBindingSize ${gpu.limits.maxStorageBufferBindingSize}, ` +
      `maxComputeWorkgroupStorageSize ${gpu.limits.maxComputeWorkgroupStorageSize}; shapes: ${
        r.small ? "small" : "big"
      }, e2e iters ${r.iters}, device reps ${r.reps}`,
  );
}

/** The same-run yardsticks. */
interface Yardsticks {
  copy: CopyResult;
  fma: FmaResult;
}

/** The copy (GB/s) and FMA (TFLOP/s) yardsticks, each logged. */
async function yardsticks({ gpu, small, log }: BenchRun): Promise<Yardsticks> {
  const copy = await copyBench(gpu, 2 ** 31, small ? 20 : 100, small ? 4 : 20);
  log(
    `copy ${(copy.bytes / 2 ** 20).toFixed(0)} MiB: ${f(copy.gbps)} GB/s (read+write, best batch)`,
  );
  const fma = await fmaBench(gpu, small ? 150 : 20, small ? 2 : 5);
  log(
    `fma: ${f(fma.tflops)} TFLOP/s f32 (${fma.workgroups} x ${fma.wg} invocations, ${fma.iters} ` +
      `iterations, ${fma.reps} dispatches, ${fma.timed_by})`,
  );
  return { copy, fma };
}

/** Every shape's rows (bench/measure_shapes.ts), the clock held warm meanwhile. */
async function measureRows(r: BenchRun, y: Yardsticks, variants: Variant[]): Promise<BackendRow[]> {
  const { a, gpu, small, iters, reps } = r;
  const warm = await holdClock(r.mgr, !a["no-keep-warm"] && !r.software, r.log);
  try {
    const only = a.shapes ?? Deno.env.get("BENCH_SHAPES");
    const o = {
      gpu,
      small,
      iters,
      reps,
      copyGbps: y.copy.gbps,
      fmaTflops: y.fma.tflops,
      only: only ? new RegExp(only) : null,
      hnd: a.hnd || Deno.env.get("BENCH_HND") === "1",
      prefillCaches: prefillCachesOf(Deno.env.get("BENCH_PREFILL_CACHES") ?? ""),
      prefillGroups: prefillGroupsOf(Deno.env.get("BENCH_PREFILL_GQA") ?? ""),
      anchor: r.anchor,
    };
    return await measureShapes(o, variants, a.case!, r.log);
  } finally {
    await warm?.close();
  }
}

/** `--plot FILE.svg`. */
async function writePlot(
  file: string,
  r: BenchRun,
  y: Yardsticks,
  rows: BackendRow[],
): Promise<void> {
  const report = r.mgr.report();
  await Deno.writeTextFile(
    file,
    plotSvg(rows, {
      adapter: r.info.description || r.info.device || r.info.vendor,
      runtime: report.runtime,
      copyGbps: y.copy.gbps,
      fmaTflops: y.fma.tflops,
    }),
  );
  r.log(`plot: ${file}`);
}

/** `--json`: the run as one JSON document on stdout. */
function printJson(r: BenchRun, { copy, fma }: Yardsticks, rows: BackendRow[]): void {
  const report = r.mgr.report();
  const anchor = r.anchor;
  console.log(JSON.stringify(
    {
      runtime: report.runtime,
      runtime_version: report.runtime_version,
      runtime_flags: report.runtime_flags,
      backend_api: report.backend_api,
      round_trip_ms: r.roundTrip,
      read_round_trip_ms: r.readTrip,
      adapter: r.info,
      features: [...r.gpu.features],
      small: r.small,
      iters: r.iters,
      reps: r.reps,
      copy,
      fma,
      ...(anchor
        ? {
          anchor: {
            file: r.anchorFile,
            device: anchor.device,
            torch: anchor.torch,
            x_sdpa: "SDPA ms / device ms (above 1: ours faster)",
            x_sdpa_stream: "SDPA ms / the repetitions' one-pass ms (SDPA's own way of timing)",
            entries: anchor.entries,
          },
        }
        : {}),
      rows,
    },
    null,
    2,
  ));
}

/** The legends and the table of every row. */
function printTable(r: BenchRun, { copy, fma }: Yardsticks, rows: BackendRow[]): void {
  console.log(
    `\ncopy ${f(copy.gbps)} GB/s, FMA ceiling ${f(fma.tflops)} TFLOP/s (same run); device ms = ` +
      `attention kernels per call (median of ${r.reps} in one submit); xFMA = TFLOP/s / FMA; ` +
      `xcopy = KV GB/s / copy GB/s`,
  );
  if (rows.some((row) => row.device_parts !== undefined)) {
    console.log(
      "mixed rows: decode + prefill ms = the device ms of the decode rows' passes + the " +
        "prefill rows' passes (together: the same passes ran both); KV GB/s is the decode " +
        "part's, TFLOP/s the prefill part's",
    );
  }
  if (r.anchor) console.log(anchorLegend(r.anchor, r.anchorFile!));
  for (const l of table(rows, { sdpa: r.anchor !== null })) console.log(l);
}

async function main(): Promise<void> {
  const a = benchArgs(Deno.args);
  if (a.help) return console.log(USAGE);
  if (!["decode", "prefill", "mixed", "all"].includes(a.case!)) {
    throw new Error(`--case ${a.case}: use decode, prefill, mixed or all`);
  }
  // The anchor is read before the device: a wrong path fails at once.
  const anchorFile = a.anchor ?? (Deno.env.get("BENCH_ANCHOR") || undefined);
  const anchor = await readAnchor(anchorFile);
  const variants: Variant[] = [
    ...flashVariants(a["flash-tiles"] ?? Deno.env.get("BENCH_FLASH_TILES")),
    ...decodeVariants(a["decode-tunings"] ?? Deno.env.get("BENCH_DECODE_TUNINGS")),
  ];
  const run = await benchRun(a, await benchDevice(a), anchor, anchorFile);
  logDevice(run);
  const y = await yardsticks(run);
  const rows = await measureRows(run, y, variants);
  if (a.plot) await writePlot(a.plot, run, y, rows);
  if (a.json) return printJson(run, y, rows);
  printTable(run, y, rows);
}

if (import.meta.main) await main();
