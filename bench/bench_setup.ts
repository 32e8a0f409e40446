/**
 * The setup of a `deno task bench` run (bench/main.ts): its flags, the anchor file, the device
 * of the selected runtime, and the run's sizes and round trips. A bad flag or anchor file, or no
 * device, exits with status 2 (an unknown flag throws).
 * @module
 */
import { parseArgs } from "node:util";
import { acquireSelected } from "../gpu/device.ts";
import type { WebGpuDeviceManager } from "../gpu/device_manager.ts";
import { isSoftwareAdapter } from "../gpu/runtime_adapter.ts";
import { completionRoundTrip, readRoundTrip } from "../gpu/runtime_device.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../gpu/runtime_options.ts";
import type { GpuContext } from "../core/types.ts";
import { type Anchor, loadAnchor } from "./anchor.ts";

const median = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];

/** The bench's flags (node:util `parseArgs` options). */
const BENCH_FLAGS = {
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
} as const;

/** The flags as given (an unknown flag throws). */
export function benchArgs(args: string[]) {
  return parseArgs({ args, options: BENCH_FLAGS }).values;
}

/** The parsed flags. */
export type BenchArgs = ReturnType<typeof benchArgs>;

/** A bad flag or file: its message on stderr, exit status 2. */
function exitUsage(e: unknown): never {
  console.error(e instanceof Error ? e.message : e);
  Deno.exit(2);
}

/** The anchor file, if one is named (exits 2 on a file it cannot read). */
export async function readAnchor(file: string | undefined): Promise<Anchor | null> {
  if (!file) return null;
  try {
    return await loadAnchor(file);
  } catch (e) {
    exitUsage(e);
  }
}

/** The device of the selected runtime; exits 2 on a bad runtime flag or without a device. */
export async function benchDevice(
  a: BenchArgs,
): Promise<{ mgr: WebGpuDeviceManager; gpu: GpuContext }> {
  let runtime;
  try {
    runtime = resolveRuntimeOptions(
      { runtime: a.runtime, dawnFlags: a["dawn-flags"], dawnFlag: a["dawn-flag"] },
      runtimeEnv(),
      "--runtime",
    );
  } catch (e) {
    exitUsage(e);
  }
  const { manager: mgr, ctx: gpu } = await acquireSelected(runtime);
  if (!gpu) {
    console.error(`no WebGPU device on runtime ${mgr.runtime.name}: ${mgr.report().reason}`);
    Deno.exit(2);
  }
  return { mgr, gpu };
}

/** One run's device, its sizes and round trips, the anchor and where its lines go. */
export interface BenchRun {
  a: BenchArgs;
  mgr: WebGpuDeviceManager;
  gpu: GpuContext;
  info: GpuContext["adapter_info"];
  software: boolean;
  small: boolean;
  iters: number;
  reps: number;
  roundTrip: number;
  readTrip: number;
  anchor: Anchor | null;
  anchorFile: string | undefined;
  /** A progress line (none with `--json`). */
  log: (s: string) => void;
}

/** Measures the round trips and settles the sizes (small shapes on software adapters). */
export async function benchRun(
  a: BenchArgs,
  { mgr, gpu }: { mgr: WebGpuDeviceManager; gpu: GpuContext },
  anchor: Anchor | null,
  anchorFile: string | undefined,
): Promise<BenchRun> {
  const roundTrip = median((await completionRoundTrip(gpu.device, 50)).ms);
  const readTrip = median(await readRoundTrip(gpu.device, 50));
  const info = gpu.adapter_info;
  const software = isSoftwareAdapter(info);
  const small = a.big ? false : a.small ?? software;
  const iters = a.iters ? Number(a.iters) : small ? 2 : 3;
  const reps = a.reps ? Number(a.reps) : small ? 3 : 10;
  const log = (s: string) => a.json ? undefined : console.log(s);
  return {
    a,
    mgr,
    gpu,
    info,
    software,
    small,
    iters,
    reps,
    roundTrip,
    readTrip,
    anchor,
    anchorFile,
    log,
  };
}
