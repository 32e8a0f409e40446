/**
 * A WebGPU device with subgroup matrices for the tensor-core prefill kernel, acquired on its
 * own: Dawn (npm `webgpu` 0.6.2, loaded on demand) with `chromium-experimental-subgroup-matrix`,
 * `shader-f16`, `subgroups` and every adapter limit. The tests and the bench use it; a context
 * from gpu/device.ts's Dawn runtime serves as well, with `mmaSupportOf(ctx)`
 * (gpu/flash_mma_kernel.ts) in place of {@link MmaContext.mma}. Every way of not getting one
 * (the addon does not load, no adapter, no feature, no f16 -> f32 configuration, a varying
 * subgroup size) is a stated reason, never an exception.
 * @module
 */
import type { GpuContext } from "../core/types.ts";
import { numericLimits, WebGpuContext } from "./device.ts";
import { MMA_FEATURE, type MmaSupport } from "./flash_mma_kernel.ts";
import { resolveRuntimeOptions, runtimeEnv } from "./runtime_options.ts";
import { DAWN_PACKAGE, importDawn } from "./runtime_dawn.ts";

/**
 * Dawn's flags for the feature: the runtime's (unsafe APIs, f16 on NVIDIA, stamps), or
 * ATTN_DAWN_FLAGS where set, as the server reads them (gpu/runtime_options.ts).
 */
export function dawnMmaFlags(): string[] {
  return resolveRuntimeOptions({}, runtimeEnv()).dawnFlags;
}

/** A GPU context whose device may run the subgroup-matrix kernel. */
export interface MmaContext extends GpuContext {
  /** The f16 x f16 -> f32 subgroup-matrix dims used, and the one subgroup size. */
  readonly mma: MmaSupport;
}

/** A context, or why there is none. */
export type MmaAcquired = { ctx: MmaContext; reason: null } | { ctx: null; reason: string };

interface MatrixConfig {
  componentType: string;
  resultComponentType: string;
  M: number;
  N: number;
  K: number;
}

const REQUIRED = [MMA_FEATURE, "shader-f16", "subgroups"];
let keep: unknown[] = []; // the Dawn GPU objects stay referenced while devices live

const why = (e: unknown) => (e instanceof Error ? e.message : String(e)).split("\n")[0];

/** The f16 -> f32 configuration of an adapter's `subgroupMatrixConfigs`, or null. */
export function pickMatrixConfig(
  configs: readonly MatrixConfig[],
): { m: number; n: number; k: number } | null {
  const c = configs.find((x) => x.componentType === "f16" && x.resultComponentType === "f32");
  return c ? { m: c.M, n: c.N, k: c.K } : null;
}

/** Acquires a Dawn device with subgroup matrices, or says why it cannot. */
export async function acquireMmaDevice(flags = dawnMmaFlags()): Promise<MmaAcquired> {
  let create: (f: string[]) => GPU;
  try {
    ({ create } = await importDawn()); // with the poll pacer: v0.7's stalls were these tests
  } catch (e) {
    return { ctx: null, reason: `Dawn (${DAWN_PACKAGE}) did not load: ${why(e)}` };
  }
  let adapter: GPUAdapter | null;
  try {
    const gpu = create(flags);
    keep.push(gpu);
    adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
  } catch (e) {
    return { ctx: null, reason: `Dawn found no adapter: ${why(e)}` };
  }
  if (!adapter) return { ctx: null, reason: "Dawn found no adapter" };
  const info = adapter.info as GPUAdapterInfo & {
    subgroupMatrixConfigs?: MatrixConfig[];
    subgroupMinSize?: number;
    subgroupMaxSize?: number;
  };
  const name = `${info.vendor} ${info.description || info.device}`.trim();
  const has = (f: string) => adapter!.features.has(f as GPUFeatureName);
  const missing = REQUIRED.filter((f) => !has(f));
  if (missing.length) return { ctx: null, reason: `${name} lacks ${missing.join(", ")}` };
  const dims = pickMatrixConfig(info.subgroupMatrixConfigs ?? []);
  if (!dims) {
    return { ctx: null, reason: `${name} has no f16 -> f32 subgroup-matrix configuration` };
  }
  const sgMin = info.subgroupMinSize ?? 0, sgMax = info.subgroupMaxSize ?? 0;
  if (!(sgMin > 0 && sgMin === sgMax)) {
    return { ctx: null, reason: `${name} has subgroup sizes ${sgMin}..${sgMax}, not one size` };
  }
  const features = [...REQUIRED];
  if (has("timestamp-query")) features.push("timestamp-query");
  let device: GPUDevice;
  try {
    device = await adapter.requestDevice({
      requiredFeatures: features as GPUFeatureName[],
      requiredLimits: numericLimits(adapter.limits),
      label: "flash-mma",
    });
  } catch (e) {
    return { ctx: null, reason: `${name}: requestDevice failed: ${why(e)}` };
  }
  const base = new WebGpuContext(device, {
    vendor: String(info.vendor ?? ""),
    architecture: String(info.architecture ?? ""),
    device: String(info.device ?? ""),
    description: String(info.description ?? ""),
    subgroup_min_size: sgMin,
    subgroup_max_size: sgMax,
  }, 1);
  return { ctx: Object.assign(base, { mma: { ...dims, sg: sgMin } }), reason: null };
}

/** Destroys the device and drops the Dawn objects. */
export function releaseMmaDevice(ctx: MmaContext | null): void {
  ctx?.device.destroy();
  keep = [];
}
