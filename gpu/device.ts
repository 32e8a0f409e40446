/**
 * The WebGPU device layer: acquires an adapter from a runtime (gpu/runtime.ts: Deno's
 * `navigator.gpu` by default, or Dawn) and a device from it, asks for every limit at the
 * adapter's own value and for the optional features the kernels can use (`shader-f16`,
 * `timestamp-query`, `subgroups`, `chromium-experimental-subgroup-matrix`), watches for
 * device loss and re-acquires on demand with a bumped generation, and reports it all.
 *
 * Only gpu/runtime*.ts touch a `GPU` object; everything else receives a {@link GpuContext}.
 *
 * Its parts live beside it: the live device and the watch on its loss (gpu/device_context.ts),
 * the manager that acquires, re-acquires, closes and reports it (gpu/device_manager.ts), and
 * the provider with no device (gpu/no_device_provider.ts); their exports are re-exported here,
 * with {@link acquireSelected}, which picks the runtime and acquires the first device.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import {
  autoWithoutDawn,
  loadRuntime,
  type RuntimeLoader,
  type RuntimeSelection,
  selectRuntime,
} from "./runtime.ts";
import type { RuntimeOptions } from "./runtime_options.ts";
import { WebGpuDeviceManager } from "./device_manager.ts";

export { numericLimits, OPPORTUNISTIC_FEATURES, WANTED_FEATURES } from "./runtime_device.ts";
export { type LostListener, onDeviceLost, WebGpuContext } from "./device_context.ts";
export { WebGpuDeviceManager, type WebGpuDeviceManagerOptions } from "./device_manager.ts";
export { NoDeviceProvider } from "./no_device_provider.ts";

/** A manager on the selected runtime, its first device (null: none), and the selection. */
export interface SelectedDevice {
  manager: WebGpuDeviceManager;
  ctx: GpuContext | null;
  selection: RuntimeSelection;
}

/**
 * A manager on the runtime `opts` selects ({@link selectRuntime}), with its first device
 * acquired. `auto` chooses Dawn on a hardware adapter before asking it for a device: where Dawn
 * then makes none, Deno's runtime serves instead ({@link autoWithoutDawn}), and the report says
 * why Dawn was not chosen. An explicit runtime gets no fall-back (`ctx` null, the reason in
 * the manager's report).
 */
export async function acquireSelected(
  opts: RuntimeOptions,
  load: RuntimeLoader = loadRuntime,
): Promise<SelectedDevice> {
  let selection = await selectRuntime(opts, load);
  let manager = new WebGpuDeviceManager({ selection, load });
  let ctx = await manager.acquire();
  if (!ctx) {
    const instead = await autoWithoutDawn(selection, manager.report().reason ?? "no device", load);
    if (instead !== selection) {
      manager.close();
      selection = instead;
      manager = new WebGpuDeviceManager({ selection, load });
      ctx = await manager.acquire();
    }
  }
  return { manager, ctx, selection };
}
