/**
 * Stand-ins for tests without a GPU: a GPUDevice for what watches a device's life (plan caches,
 * device managers): no features, no limits, and a `lost` promise that settles when the device is
 * destroyed; and a GpuContext with Dawn's subgroup-matrix feature for what plans from features
 * and limits alone, with a layer and cache to plan the split-KV kernel's shape for on it.
 * @module
 */
import type { GpuContext, KvCacheSpec, LayerSpec } from "../../core/types.ts";
import { plainLayer } from "../../core/layer.ts";
import { MMA_FEATURE } from "../../gpu/flash_mma_kernel.ts";

/** A fake device, lost (with `message`) once destroyed. */
export function lostOnDestroyDevice(message = ""): GPUDevice {
  let lose!: (info: GPUDeviceLostInfo) => void;
  const lost = new Promise<GPUDeviceLostInfo>((r) => (lose = r));
  return {
    features: new Set<string>(),
    limits: {},
    lost,
    destroy: () => lose({ reason: "destroyed", message } as GPUDeviceLostInfo),
  } as unknown as GPUDevice;
}

/**
 * A fake GpuContext (no device) like an H100/H200 under Dawn: subgroups of 32 and, with `mma`,
 * Dawn's subgroup-matrix feature with an f16 -> f32 16x16x16 configuration; 32 KB of
 * workgroup memory unless `limits` says otherwise. For what plans from features and limits
 * alone (flashRouting, the tensor-core kernel's refusals).
 */
export function fakeMmaContext(mma: boolean, limits: Record<string, number> = {}): GpuContext {
  return {
    device: {} as GPUDevice,
    adapter_info: {
      vendor: "nvidia",
      architecture: "hopper",
      device: "",
      description: "fake GPU",
      subgroup_min_size: 32,
      subgroup_max_size: 32,
      ...(mma
        ? {
          subgroup_matrix_configs: [
            { component_type: "f16", result_component_type: "f32", m: 16, n: 16, k: 16 },
          ],
        }
        : {}),
    },
    features: new Set(["shader-f16", "subgroups", ...(mma ? [MMA_FEATURE] : [])]),
    limits: {
      maxComputeWorkgroupStorageSize: 32768,
      maxComputeInvocationsPerWorkgroup: 1024,
      maxComputeWorkgroupSizeX: 1024,
      maxStorageBufferBindingSize: 2 ** 30,
      maxBufferSize: 2 ** 30,
      maxStorageBuffersPerShaderStage: 10,
      ...limits,
    },
    generation: 1,
    lost: false,
  } as GpuContext;
}

/** A layer (8 q / 2 kv heads, head 128) for `decodeShape` on {@link fakeMmaContext}. */
export const FAKE_SHAPE_LAYER: LayerSpec = plainLayer({
  num_heads: 8,
  num_kv_heads: 2,
  head_size: 128,
});

/** An f16 NHD cache of block 16 for {@link FAKE_SHAPE_LAYER}. */
export const FAKE_SHAPE_SPEC: KvCacheSpec = {
  num_blocks: 8,
  block_size: 16,
  num_kv_heads: 2,
  head_size: 128,
  dtype: "float16",
  kv_cache_dtype: "float16",
  layout: "NHD",
};
