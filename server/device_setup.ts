/**
 * The server's device at start-up: no device with `--no-gpu`, else the selected WebGPU runtime
 * (`--webgpu-runtime deno|dawn|auto`) and its device, with one start-up line naming runtime,
 * version, backend API and adapter; an explicit `dawn` that cannot start exits 2 with Dawn's
 * own reason. The runtime not chosen is probed once in the background (no device) so
 * `/v1/device` can say why it was not used.
 * @module
 */
import type { DeviceProvider } from "../core/types.ts";
import { NoDeviceProvider, WebGpuDeviceManager } from "../gpu/device.ts";
import { selectRuntime } from "../gpu/runtime.ts";
import type { RuntimeOptions } from "../gpu/runtime_options.ts";
import { deviceSummary, otherRuntimesSummary } from "../gpu/runtime_report.ts";

/** The device provider and how to release it at shutdown. */
export async function acquireDevice(
  gpu: boolean,
  runtime: RuntimeOptions,
): Promise<{ device: DeviceProvider; close: () => void }> {
  if (!gpu) {
    console.error("webgpu: disabled (--no-gpu)");
    return { device: new NoDeviceProvider(), close: () => {} };
  }
  const mgr = new WebGpuDeviceManager({ selection: await selectRuntime(runtime) });
  const ctx = await mgr.acquire();
  if (!ctx && runtime.choice === "dawn") {
    console.error(`webgpu: --webgpu-runtime dawn cannot start: ${mgr.report().reason}`);
    Deno.exit(2);
  }
  console.error(`webgpu: ${deviceSummary(mgr.report())}`);
  mgr.probeOtherRuntimes().then(() => {
    for (const line of otherRuntimesSummary(mgr.report())) console.error(`webgpu: ${line}`);
  });
  return { device: mgr, close: () => mgr.close() };
}
