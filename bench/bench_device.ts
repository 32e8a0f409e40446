/**
 * The device of a one-off bench script (host_profile, host_hot, io_probe): the runtime named by
 * `--runtime` (or `ATTN_WEBGPU_RUNTIME`), acquired once; exits with the runtime's reason when
 * there is none.
 * @module
 */
import type { WebGpuDeviceManager } from "../mod.ts";
import type { GpuContext } from "../core/types.ts";
import { acquireSelected } from "../gpu/device.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../gpu/runtime_options.ts";

/** The device manager and its device; the process exits (2) naming why when there is none. */
export async function benchDevice(
  runtime: string | undefined,
): Promise<{ device: WebGpuDeviceManager; gpu: GpuContext }> {
  const { manager: device, ctx: gpu } = await acquireSelected(
    resolveRuntimeOptions({ runtime }, runtimeEnv(), "--runtime"),
  );
  if (!gpu) {
    console.error(`no WebGPU device: ${device.report().reason}`);
    Deno.exit(2);
  }
  return { device, gpu };
}
