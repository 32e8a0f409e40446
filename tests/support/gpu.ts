/**
 * The GPU tests' shared device, from the runtime named by `ATTN_WEBGPU_RUNTIME` (`deno`, the
 * default, `dawn` or `auto`; Dawn's flags from `ATTN_DAWN_FLAGS`), so the whole GPU suite runs
 * unchanged on either runtime. No test reaches for `navigator.gpu` or builds its own runtime:
 * they take {@link GPU} / {@link gpu}, or {@link newManager} / {@link requestAdapter} for a
 * device or adapter of their own on the same runtime, or {@link SERVE_RUNTIME} for a server
 * process on it (tests/client/imports_test.ts holds the tests to this).
 *
 * Where the runtime has no adapter, {@link NO_GPU} is true (tests set `ignore: NO_GPU`) and
 * the reason, the runtime's own words, is printed once.
 * @module
 */
import type { GpuContext } from "../../core/types.ts";
import { acquireSelected, WebGpuDeviceManager } from "../../gpu/device.ts";
import type { RuntimeSelection } from "../../gpu/runtime.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../../gpu/runtime_options.ts";

// As the server starts: `auto` whose Dawn makes no device falls back to Deno's runtime.
const selected = await acquireSelected(
  resolveRuntimeOptions({}, runtimeEnv(), "ATTN_WEBGPU_RUNTIME"),
);

/** The runtime the suite runs on, as selected from the environment. */
export const SELECTION: RuntimeSelection = selected.selection;

/** The shared manager (one device per test file). */
export const MANAGER: WebGpuDeviceManager = selected.manager;
const ctx = selected.ctx;

/** The shared GPU context, or null when the runtime has no adapter. */
export const GPU: GpuContext | null = ctx;

/** Set `ignore: NO_GPU` on GPU tests: true (skipped) when there is no adapter. */
export const NO_GPU: boolean = ctx === null;

/** Why there is no GPU ("" when there is one). */
export const NO_GPU_REASON: string = ctx ? "" : MANAGER.report().reason ?? "no WebGPU adapter";

if (NO_GPU) {
  console.warn(`GPU tests skipped (runtime ${SELECTION.runtime.name}): ${NO_GPU_REASON}`);
}

// The shared device is not destroyed at the end: Deno's test runner has no per-file hook
// but `unload`, and destroying a Dawn device there crashes the process (SIGSEGV: Dawn
// settles `device.lost` after the isolate is gone). Process exit releases it; tests that
// make their own device (newManager) close it themselves.

/** The context; throws when called without one (tests are ignored then). */
export function gpu(): GpuContext {
  if (!ctx) throw new Error("no GPU");
  return ctx;
}

/**
 * What a server process (server/main.ts, tests/server/process.ts) needs to serve on the suite's
 * runtime: `--webgpu-runtime` naming the runtime selected here (with Dawn's flags), and the
 * permission Dawn, a Node-API addon, loads with.
 */
export const SERVE_RUNTIME: { args: readonly string[]; perms: readonly string[] } = Object.freeze({
  args: SELECTION.runtime.name === "dawn"
    ? ["--webgpu-runtime", "dawn", "--dawn-flags", SELECTION.dawnFlags.join(",")]
    : ["--webgpu-runtime", SELECTION.runtime.name],
  perms: ["--allow-ffi"],
});

/** A new manager on the suite's runtime (its own device: loss tests destroy it). */
export function newManager(): WebGpuDeviceManager {
  return new WebGpuDeviceManager({ selection: SELECTION });
}

/** A fresh adapter of the suite's runtime (to compare a device with), or null. */
export async function requestAdapter(): Promise<GPUAdapter | null> {
  return (await SELECTION.runtime.requestAdapter({ powerPreference: "high-performance" }))
    .adapter;
}
