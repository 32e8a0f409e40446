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
 * The parts live beside it: the measurement loop over shapes and backends
 * (bench/measure_shapes.ts), the keep-warm spins through the run (bench/hold_clock.ts) and the
 * BENCH_PREFILL_CACHES / BENCH_PREFILL_GQA lists (bench/prefill_env.ts).
 * @module
 */
import { parseArgs } from "node:util";
import { plotSvg } from "./plot.ts";
import { measureShapes } from "./measure_shapes.ts";
import { prefillCachesOf, prefillGroupsOf } from "./prefill_env.ts";
import { acquireSelected } from "../gpu/device.ts";
import { describeAdapter, isSoftwareAdapter } from "../gpu/runtime_adapter.ts";
import { completionRoundTrip, readRoundTrip } from "../gpu/runtime_device.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../gpu/runtime_options.ts";
import { deviceSummary } from "../gpu/runtime_report.ts";
import { copyBench } from "./copy.ts";
import { fmaBench } from "./fma.ts";
import type { BackendRow } from "./measure.ts";
import { f, table } from "./report_text.ts";
import { type Anchor, anchorLegend, loadAnchor } from "./anchor.ts";
import { decodeVariants, flashVariants, type Variant } from "./variants.ts";
import { holdClock } from "./hold_clock.ts";

const USAGE = "deno task bench [--runtime deno|dawn|auto] [--dawn-flags L] [--dawn-flag K=V] " +
  "[--case decode|prefill|mixed|all] [--small|--big] [--iters N] [--reps N] " +
  "[--flash-tiles 8x8x4x4,...] [--decode-tunings JSON-array] [--shapes REGEX] [--hnd] " +
  "[--anchor torch_anchor.json] [--json] [--plot FILE.svg] " +
  "[--no-keep-warm]";

const median = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];

async function main(): Promise<void> {
  const { values: a } = parseArgs({
    args: Deno.args,
    options: {
      runtime: { type: "string" },
      "dawn-flags": { type: "string" },
      "dawn-flag": { type: "string", multiple: true },
      iters: { type: "string" },
      reps: { type: "string" },
      case: { type: "string", default: "all" },
      small: { type: "boolean" },
      big: { type: "boolean" },
      "flash-tiles": { type: "string" },
      "decode-tunings": { type: "string" },
      shapes: { type: "string" },
      hnd: { type: "boolean", default: false },
      anchor: { type: "string" },
      json: { type: "boolean", default: false },
      plot: { type: "string" },
      "no-keep-warm": { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
  if (a.help) return console.log(USAGE);
  if (!["decode", "prefill", "mixed", "all"].includes(a.case!)) {
    throw new Error(`--case ${a.case}: use decode, prefill, mixed or all`);
  }
  // The anchor is read before the device: a wrong path fails at once.
  const anchorFile = a.anchor ?? (Deno.env.get("BENCH_ANCHOR") || undefined);
  let anchor: Anchor | null = null;
  if (anchorFile) {
    try {
      anchor = await loadAnchor(anchorFile);
    } catch (e) {
      console.error(e instanceof Error ? e.message : e);
      Deno.exit(2);
    }
  }
  const variants: Variant[] = [
    ...flashVariants(a["flash-tiles"] ?? Deno.env.get("BENCH_FLASH_TILES")),
    ...decodeVariants(a["decode-tunings"] ?? Deno.env.get("BENCH_DECODE_TUNINGS")),
  ];
  let runtime;
  try {
    runtime = resolveRuntimeOptions(
      { runtime: a.runtime, dawnFlags: a["dawn-flags"], dawnFlag: a["dawn-flag"] },
      runtimeEnv(),
      "--runtime",
    );
  } catch (e) {
    console.error(e instanceof Error ? e.message : e);
    Deno.exit(2);
  }
  const { manager: mgr, ctx: gpu } = await acquireSelected(runtime);
  if (!gpu) {
    console.error(`no WebGPU device on runtime ${mgr.runtime.name}: ${mgr.report().reason}`);
    Deno.exit(2);
  }
  const roundTrip = median((await completionRoundTrip(gpu.device, 50)).ms);
  const readTrip = median(await readRoundTrip(gpu.device, 50));
  const info = gpu.adapter_info;
  const software = isSoftwareAdapter(info);
  const small = a.big ? false : a.small ?? software;
  const iters = a.iters ? Number(a.iters) : small ? 2 : 3;
  const reps = a.reps ? Number(a.reps) : small ? 3 : 10;
  const log = (s: string) => a.json ? undefined : console.log(s);
  log(`runtime: ${deviceSummary(mgr.report())}`);
  log(`completion round trip (empty submit + 16 B mapAsync): median ${f(roundTrip)} ms`);
  log(
    `read-back round trip (16 B copy + read, as forward calls read back): median ${f(readTrip)} ms`,
  );
  log(
    `adapter: ${describeAdapter(info)}, DENO_WEBGPU_BACKEND=${
      Deno.env.get("DENO_WEBGPU_BACKEND") ?? "(default)"
    }`,
  );
  log(`features: ${[...gpu.features].sort().join(", ")}`);
  log(
    `maxStorageBufferBindingSize ${gpu.limits.maxStorageBufferBindingSize}, ` +
      `maxComputeWorkgroupStorageSize ${gpu.limits.maxComputeWorkgroupStorageSize}; shapes: ${
        small ? "small" : "big"
      }, e2e iters ${iters}, device reps ${reps}`,
  );
  const copy = await copyBench(gpu, 2 ** 31, small ? 20 : 100, small ? 4 : 20);
  log(
    `copy ${(copy.bytes / 2 ** 20).toFixed(0)} MiB: ${f(copy.gbps)} GB/s (read+write, best batch)`,
  );
  const fma = await fmaBench(gpu, small ? 150 : 20, small ? 2 : 5);
  log(
    `fma: ${f(fma.tflops)} TFLOP/s f32 (${fma.workgroups} x ${fma.wg} invocations, ${fma.iters} ` +
      `iterations, ${fma.reps} dispatches, ${fma.timed_by})`,
  );

  const warm = await holdClock(mgr, !a["no-keep-warm"] && !software, log);
  let rows: BackendRow[];
  try {
    const only = a.shapes ?? Deno.env.get("BENCH_SHAPES");
    const o = {
      gpu,
      small,
      iters,
      reps,
      copyGbps: copy.gbps,
      fmaTflops: fma.tflops,
      only: only ? new RegExp(only) : null,
      hnd: a.hnd || Deno.env.get("BENCH_HND") === "1",
      prefillCaches: prefillCachesOf(Deno.env.get("BENCH_PREFILL_CACHES") ?? ""),
      prefillGroups: prefillGroupsOf(Deno.env.get("BENCH_PREFILL_GQA") ?? ""),
      anchor,
    };
    rows = await measureShapes(o, variants, a.case!, log);
  } finally {
    await warm?.close();
  }
  if (a.plot) {
    const r = mgr.report();
    await Deno.writeTextFile(
      a.plot,
      plotSvg(rows, {
        adapter: info.description || info.device || info.vendor,
        runtime: r.runtime,
        copyGbps: copy.gbps,
        fmaTflops: fma.tflops,
      }),
    );
    log(`plot: ${a.plot}`);
  }
  if (a.json) {
    const r = mgr.report();
    console.log(JSON.stringify(
      {
        runtime: r.runtime,
        runtime_version: r.runtime_version,
        runtime_flags: r.runtime_flags,
        backend_api: r.backend_api,
        round_trip_ms: roundTrip,
        read_round_trip_ms: readTrip,
        adapter: info,
        features: [...gpu.features],
        small,
        iters,
        reps,
        copy,
        fma,
        ...(anchor
          ? {
            anchor: {
              file: anchorFile,
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
    return;
  }
  console.log(
    `\ncopy ${f(copy.gbps)} GB/s, FMA ceiling ${f(fma.tflops)} TFLOP/s (same run); device ms = ` +
      `attention kernels per call (median of ${reps} in one submit); xFMA = TFLOP/s / FMA; ` +
      `xcopy = KV GB/s / copy GB/s`,
  );
  if (rows.some((r) => r.device_parts !== undefined)) {
    console.log(
      "mixed rows: decode + prefill ms = the device ms of the decode rows' passes + the " +
        "prefill rows' passes (together: the same passes ran both); KV GB/s is the decode " +
        "part's, TFLOP/s the prefill part's",
    );
  }
  if (anchor) console.log(anchorLegend(anchor, anchorFile!));
  for (const l of table(rows, { sdpa: anchor !== null })) console.log(l);
}

if (import.meta.main) await main();
