/**
 * `deno task bench [--runtime deno|dawn|auto] [--dawn-flags L] [--dawn-flag K=V] [--iters N]
 * [--case decode|prefill|all] [--small|--big] [--json]`: kernel timings beside a same-run copy
 * kernel's bandwidth.
 *
 * 1. Selects the WebGPU runtime (`--runtime`, else ATTN_WEBGPU_RUNTIME, else deno), acquires
 *    the device through {@link WebGpuDeviceManager}, prints runtime and adapter and the
 *    runtime's completion round trip (empty submit + 16-byte mapAsync).
 * 2. Copy: bench/copy.wgsl (vec4<u32>) over the largest buffer the binding limit allows (up
 *    to 2 GiB; 128 MiB on this project's software adapters), many dispatches per sync,
 *    timed by timestamp-query when granted and by the wall clock → GB/s (read + write).
 * 3. Decode and prefill batches (smaller on software adapters): every backend the registry's
 *    capability checks accept runs plan + run repeatedly; reported are the end-to-end ms per
 *    call (median), the readback floor measured in the same run, the floor-subtracted kernel
 *    estimate, KV GB/s (decode: bytes of K+V read) or TFLOP/s (prefill: 4·T·S·H·D/2 causal),
 *    and the ratio to the copy GB/s. The CPU reference is skipped for big cases.
 * @module
 */
import { parseArgs } from "node:util";
import { validateConfiguration } from "../backends/capabilities.ts";
import { builtinBackends } from "../backends/index.ts";
import type { AttentionBackend, BackendContext, DataArray } from "../core/types.ts";
import { validHostBatch } from "../service/host_input.ts";
import { WebGpuDeviceManager } from "../gpu/device.ts";
import { selectRuntime } from "../gpu/runtime.ts";
import { describeAdapter, isSoftwareAdapter } from "../gpu/runtime_adapter.ts";
import { completionRoundTrip } from "../gpu/runtime_device.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../gpu/runtime_options.ts";
import { deviceSummary } from "../gpu/runtime_report.ts";
import { copyBench, readbackFloor } from "./copy.ts";
import { type BenchShape, benchShapes, makeBatch, work } from "./shapes.ts";

const median = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];

/** One backend on one shape. */
export interface BackendRow {
  case: string;
  backend: string;
  skipped?: string;
  /** First plan (pipeline compilation included) and first run. */
  plan_cold_ms?: number;
  first_run_ms?: number;
  /** Median of awaited run() calls on one plan: the end-to-end per-call time. */
  e2e_ms?: number;
  /** Median of plan() + run() per call. */
  plan_run_ms?: number;
  /** `iters` run() calls in flight at once, wall time / iters (readbacks overlap); null if the backend failed that way. */
  pipelined_ms?: number | null;
  pipelined_note?: string;
  /** The readback floor of this shape's output, measured in the same run. */
  floor_ms?: number;
  /** e2e minus the floor (device backends). */
  kernel_est_ms?: number;
  kv_gbps?: number;
  kv_gbps_pipelined?: number;
  tflops?: number;
  tflops_pipelined?: number;
  copy_ratio?: number;
  copy_ratio_pipelined?: number;
  /** The backend's own phase timings of the last awaited call. */
  timings?: Record<string, number>;
}

/** A readable name for a shape. */
export function shapeName(s: BenchShape): string {
  return `${s.kind} ${s.reqs}x${s.ctx}${s.kind === "prefill" ? " causal" : ""} ` +
    `${s.num_heads}q/${s.num_kv_heads}kv d${s.head_size} bs${s.block_size} f16`;
}

const sameBits = (x: DataArray, y: DataArray) =>
  x.bytes.byteLength === y.bytes.byteLength && x.bytes.every((v, i) => v === y.bytes[i]);

async function benchBackend(
  b: AttentionBackend,
  s: BenchShape,
  data: ReturnType<typeof makeBatch>,
  ctx: BackendContext,
  iters: number,
  floor: number,
  copyGbps: number,
): Promise<BackendRow> {
  const cache = await b.importCache(data.spec, data.key.slice(), data.value.slice(), ctx);
  try {
    const batch = validHostBatch(data.batch, cache);
    let t = performance.now();
    const plan = await b.plan(batch, ctx);
    const plan_cold_ms = performance.now() - t;
    t = performance.now();
    let res = await b.run(plan, batch, ctx);
    const first_run_ms = performance.now() - t;
    const first = res.output;
    const e2e: number[] = [];
    for (let i = 0; i < iters; i++) {
      t = performance.now();
      res = await b.run(plan, batch, ctx);
      e2e.push(performance.now() - t);
    }
    const timings = res.timings;
    const pr: number[] = [];
    for (let i = 0; i < Math.min(iters, 3); i++) {
      t = performance.now();
      await b.run(await b.plan(batch, ctx), batch, ctx);
      pr.push(performance.now() - t);
    }
    // Pipelined: all calls in flight at once, so the per-call readback latency overlaps.
    let pipelined_ms: number | null = null, pipelined_note: string | undefined;
    if (b.requires.needs_device) {
      try {
        t = performance.now();
        const all = await Promise.all(Array.from({ length: iters }, () => b.run(plan, batch, ctx)));
        pipelined_ms = (performance.now() - t) / iters;
        if (!all.every((r) => sameBits(r.output, first))) {
          pipelined_note = "outputs of concurrent calls differ from a lone call";
        }
      } catch (e) {
        pipelined_note = `concurrent calls failed: ${e instanceof Error ? e.message : e}`;
      }
    }
    const e2e_ms = median(e2e);
    const dev = b.requires.needs_device;
    const w = work(s);
    const gbps = (ms: number) => w.kv_bytes / ms / 1e6;
    const row: BackendRow = {
      case: shapeName(s),
      backend: b.name,
      plan_cold_ms,
      first_run_ms,
      e2e_ms,
      plan_run_ms: median(pr),
      pipelined_ms,
      pipelined_note,
      floor_ms: dev ? floor : 0,
      kernel_est_ms: dev ? Math.max(e2e_ms - floor, 1e-3) : e2e_ms,
      kv_gbps: gbps(e2e_ms),
      copy_ratio: gbps(e2e_ms) / copyGbps,
      timings,
    };
    if (pipelined_ms !== null) {
      row.kv_gbps_pipelined = gbps(pipelined_ms);
      row.copy_ratio_pipelined = gbps(pipelined_ms) / copyGbps;
    }
    if (s.kind === "prefill") {
      row.tflops = w.flops / e2e_ms / 1e9;
      if (pipelined_ms !== null) row.tflops_pipelined = w.flops / pipelined_ms / 1e9;
    }
    return row;
  } finally {
    cache.destroy();
  }
}

/** Three significant digits (more for big numbers), "-" for none. */
const f = (x: number | null | undefined) =>
  x === undefined || x === null ? "-" : Math.abs(x) >= 100 ? x.toFixed(0) : x.toPrecision(3);

async function main(): Promise<void> {
  const { values: a } = parseArgs({
    args: Deno.args,
    options: {
      runtime: { type: "string" },
      "dawn-flags": { type: "string" },
      "dawn-flag": { type: "string", multiple: true },
      iters: { type: "string" },
      case: { type: "string", default: "all" },
      small: { type: "boolean" },
      big: { type: "boolean" },
      json: { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
  });
  if (a.help) {
    console.log(
      "deno task bench [--runtime deno|dawn|auto] [--dawn-flags L] [--dawn-flag K=V] [--iters N] " +
        "[--case decode|prefill|all] [--small|--big] [--json]",
    );
    return;
  }
  if (!["decode", "prefill", "all"].includes(a.case!)) {
    throw new Error(`--case ${a.case}: use decode, prefill or all`);
  }
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
  const mgr = new WebGpuDeviceManager({ selection: await selectRuntime(runtime) });
  const gpu = await mgr.acquire();
  if (!gpu) {
    console.error(`no WebGPU device on runtime ${mgr.runtime.name}: ${mgr.report().reason}`);
    Deno.exit(2);
  }
  const rt = await completionRoundTrip(gpu.device, 50);
  const roundTrip = median(rt.ms);
  const info = gpu.adapter_info;
  const software = isSoftwareAdapter(info);
  const small = a.big ? false : a.small ?? software;
  const iters = a.iters ? Number(a.iters) : small ? 5 : 20;
  const log = (s: string) => a.json ? undefined : console.log(s);
  log(`runtime: ${deviceSummary(mgr.report())}`);
  log(`completion round trip (empty submit + 16 B mapAsync): median ${f(roundTrip)} ms`);
  log(
    `adapter: ${describeAdapter(info)}, backend env DENO_WEBGPU_BACKEND=${
      Deno.env.get("DENO_WEBGPU_BACKEND") ?? "(default)"
    }`,
  );
  log(`features: ${[...gpu.features].sort().join(", ")}`);
  log(
    `maxStorageBufferBindingSize ${gpu.limits.maxStorageBufferBindingSize}, maxBufferSize ${gpu.limits.maxBufferSize}; shapes: ${
      small ? "small" : "big"
    }, iters ${iters}`,
  );

  const copy = await copyBench(gpu, 2 ** 31, small ? 20 : 100, small ? 4 : 20);
  log(
    `copy ${(copy.bytes / 2 ** 20).toFixed(0)} MiB x ${copy.dispatches}: ${
      f(copy.gbps_wall)
    } GB/s wall-clock, ${
      copy.gbps_gpu === null ? "no timestamps" : `${f(copy.gbps_gpu)} GB/s by timestamp-query`
    } (read+write bytes; best sync batch ${f(copy.gbps_best)} GB/s is the yardstick)`,
  );

  const ctx: BackendContext = { gpu };
  const rows: BackendRow[] = [];
  for (const s of benchShapes(small).filter((x) => a.case === "all" || x.kind === a.case)) {
    const data = makeBatch(s);
    const floor = await readbackFloor(gpu, data.batch.query.length * 4);
    for (const b of builtinBackends()) {
      const label = shapeName(s);
      const reasons = validateConfiguration(b, data.selector, ctx);
      const bigCpu = !b.requires.needs_device && !small;
      if (reasons.length || bigCpu) {
        const why = reasons.length
          ? reasons.join("; ")
          : "host (CPU) backend skipped for big shapes";
        rows.push({ case: label, backend: b.name, skipped: why });
        log(`skip ${b.name} on ${label}: ${why}`);
        continue;
      }
      const row = await benchBackend(
        b,
        s,
        data,
        ctx,
        b.requires.needs_device ? iters : Math.min(iters, 2),
        floor,
        copy.gbps,
      );
      rows.push(row);
    }
  }
  if (a.json) {
    console.log(
      JSON.stringify(
        {
          runtime: mgr.report().runtime,
          runtime_version: mgr.report().runtime_version,
          runtime_flags: mgr.report().runtime_flags,
          backend_api: mgr.report().backend_api,
          round_trip_ms: roundTrip,
          adapter: info,
          features: [...gpu.features],
          small,
          iters,
          copy,
          rows,
        },
        null,
        2,
      ),
    );
    return;
  }
  const head = [
    "case",
    "backend",
    "e2e ms",
    "pipelined ms",
    "floor ms",
    "e2e-floor ms",
    "KV GB/s e2e",
    "KV GB/s pipe",
    "xcopy e2e",
    "xcopy pipe",
    "TFLOP/s e2e",
    "TFLOP/s pipe",
    "cold plan/run ms",
  ];
  const done = rows.filter((r) => !r.skipped);
  const table = done.map((r) => [
    r.case,
    r.backend,
    f(r.e2e_ms),
    f(r.pipelined_ms),
    f(r.floor_ms),
    f(r.kernel_est_ms),
    f(r.kv_gbps),
    f(r.kv_gbps_pipelined),
    f(r.copy_ratio),
    f(r.copy_ratio_pipelined),
    f(r.tflops),
    f(r.tflops_pipelined),
    `${f(r.plan_cold_ms)}/${f(r.first_run_ms)}`,
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...table.map((r) => r[i].length)));
  const line = (r: string[]) =>
    r.map((c, i) => i < 2 ? c.padEnd(widths[i]) : c.padStart(widths[i])).join("  ");
  console.log(
    `\ncopy: ${f(copy.gbps)} GB/s (${
      copy.gbps_gpu === null ? "wall-clock" : "timestamp-query"
    }); ` +
      `xcopy = KV GB/s / copy GB/s; pipe = ${iters} calls in flight`,
  );
  console.log(line(head));
  for (const r of table) console.log(line(r));
  for (const r of done) {
    if (r.pipelined_note) console.log(`note: ${r.backend} on ${r.case}: ${r.pipelined_note}`);
    if (r.timings) {
      const tm = Object.entries(r.timings).map(([k, v]) => `${k} ${f(v)}`).join(", ");
      console.log(`${r.backend} on ${r.case}: last call's own timings (ms): ${tm}`);
    }
  }
}

if (import.meta.main) await main();
