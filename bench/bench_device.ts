/**
 * The device of a one-off bench script (host_profile, host_hot, io_probe): the runtime named by
 * `--runtime` (or `ATTN_WEBGPU_RUNTIME`), acquired once; exits with the runtime's reason when
 * there is none.
 * @module
 */
import { WebGpuDeviceManager } from "../mod.ts";
import type { GpuContext } from "../core/types.ts";
import { selectRuntime } from "../gpu/runtime.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../gpu/runtime_options.ts";

/** The device manager and its device; the process exits (2) naming why when there is none. */
export async function benchDevice(
  runtime: string | undefined,
): Promise<{ device: WebGpuDeviceManager; gpu: GpuContext }> {
  const device = new WebGpuDeviceManager({
    selection: await selectRuntime(
      resolveRuntimeOptions({ runtime }, runtimeEnv(), "--runtime"),
    ),
  });
  const gpu = await device.acquire();
  if (!gpu) {
    console.error(`no WebGPU device: ${device.report().reason}`);
    Deno.exit(2);
  }
  return { device, gpu };
}
