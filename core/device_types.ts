/**
 * The device's vocabulary: the WebGPU device as backends see it, and what `GET /v1/device`
 * reports about it (runtime, adapter, the runtimes not chosen, keep-warm). core/types.ts
 * re-exports all of it.
 * @module
 */

/** The WebGPU device as the backends see it (null anywhere there is none). */
export interface GpuContext {
  readonly device: GPUDevice;
  readonly adapter_info: {
    vendor: string;
    architecture: string;
    device: string;
    description: string;
    subgroup_min_size?: number;
    subgroup_max_size?: number;
    is_fallback_adapter?: boolean;
  };
  /** Features granted on the device (including `subgroups` when the request succeeded). */
  readonly features: ReadonlySet<string>;
  /** The device's limits (requested at the adapter's own values). */
  readonly limits: Readonly<Record<string, number>>;
  /** Bumped each time a device is (re-)acquired. */
  readonly generation: number;
  /** True once the device was lost. */
  readonly lost: boolean;
}

/** One subgroup-matrix configuration (Dawn's `chromium-experimental-subgroup-matrix`). */
export interface SubgroupMatrixConfig {
  component_type: string;
  result_component_type: string;
  m: number;
  n: number;
  k: number;
}

/** The adapter as `GET /v1/device` reports it. */
export type AdapterInfoReport = GpuContext["adapter_info"] & {
  /** The vendor's name where `vendor` is a PCI/Khronos id (Deno's "65541" is "mesa"). */
  vendor_name?: string;
  /** Dawn's `adapter.info.subgroupMatrixConfigs`, where the runtime gives them. */
  subgroup_matrix_configs?: SubgroupMatrixConfig[];
};

/** A runtime not chosen, as a cheap probe (an adapter, never a device) found it. */
export interface RuntimeProbeReport {
  /** True when it loads and finds an adapter. */
  available: boolean;
  version?: string;
  flags?: string[];
  backend_api?: string;
  /** Why it is unavailable, or why it was not chosen. */
  reason?: string;
  adapter?: AdapterInfoReport;
}

/** What `GET /v1/device` reports. */
export interface DeviceReport {
  available: boolean;
  /** Which WebGPU implementation: "deno" (navigator.gpu), "dawn" (npm webgpu), or "none". */
  runtime: string;
  /** Deno's version for "deno"; the npm `webgpu` package's for "dawn". */
  runtime_version?: string;
  /** The flags the runtime was created with (Dawn's `create(flags)`). */
  runtime_flags?: string[];
  /** How the runtime was chosen: what was asked (deno, dawn, auto) and why this one. */
  selection?: string;
  /** The native API under WebGPU: vulkan, gl, metal, d3d12... */
  backend_api?: string;
  /** How `backend_api` is known (WebGPU itself does not say). */
  backend_api_source?: string;
  /** Why there is no device, when there is none. */
  reason?: string;
  adapter?: AdapterInfoReport;
  features: string[];
  limits: Record<string, number>;
  generation: number;
  /** How results are read back, on a live device (gpu/map_read.ts). */
  readback?: "early" | "awaited";
  /** Whether early reads wait a turn for other calls' host work first, on a live device
   * (gpu/map_read.ts mapReadRangeDeferred; `ATTN_DEFER_READ`). */
  readback_deferred?: boolean;
  /** What the runtime printed while finding the adapter (Dawn's warnings). */
  warnings?: string[];
  /** The runtimes not chosen: whether they could start here, and why not (once probed). */
  other_runtimes?: Record<string, RuntimeProbeReport>;
  /** Keep-warm spins between calls, when asked for (gpu/keep_warm.ts). */
  keep_warm?: KeepWarmReport;
}

/** What keep-warm does (`--keep-warm-ms`): whether it is on, why not, its knobs, its count. */
export interface KeepWarmReport {
  enabled: boolean;
  reason?: string;
  options: { hold_ms: number; spin_iters: number; workgroups: number; depth: number };
  round_trip_ms?: number;
  dispatches: number;
  spinning: boolean;
}

/** Owns the WebGPU device: acquires it, re-acquires after loss, reports it. */
export interface DeviceProvider {
  /** The live device, or null (none, or lost and not yet re-acquired). */
  current(): GpuContext | null;
  /** Acquires a device if there is none (or it was lost); resolves to null where no adapter exists. */
  acquire(): Promise<GpuContext | null>;
  report(): DeviceReport;
}
