/**
 * WebGPU runtimes behind one interface: Deno's own `navigator.gpu` ("deno", the default) and
 * Dawn from npm `webgpu` ("dawn", loaded by a dynamic import only when asked for, see
 * gpu/runtime_dawn.ts). A runtime hands out adapters and says why when it has none; the
 * device layer (gpu/device.ts) turns an adapter into a device the same way for both.
 *
 * {@link selectRuntime} resolves `deno`, `dawn` or `auto` (Dawn where it loads and finds a
 * hardware adapter, Deno's otherwise).
 * @module
 */
import type { RuntimeProbeReport } from "../core/types.ts";
import { describeAdapter } from "./runtime_adapter.ts";
import { loadDawnRuntime } from "./runtime_dawn.ts";
import { probeRuntime } from "./runtime_probe.ts";
import { markDenoDevice } from "./map_read.ts";
import type { RuntimeChoice, RuntimeName, RuntimeOptions } from "./runtime_options.ts";
import { envVar } from "../core/env.ts";

/** An adapter, or why there is none. */
export interface AdapterResult {
  adapter: GPUAdapter | null;
  /** Why there is no adapter (the runtime's own words where it gives any). */
  reason?: string;
  /** What the runtime printed while looking (Dawn's warnings), one entry per message. */
  warnings?: string[];
}

/** A WebGPU implementation that hands out adapters. */
export interface WebGpuRuntime {
  /** "deno", "dawn" (or a test's name). */
  readonly name: string;
  /** Deno's version, or the npm package's. */
  readonly version: string;
  /** Flags it was created with. */
  readonly flags: readonly string[];
  /** The native API its adapters run on, where known before asking (see backend_api_source). */
  readonly backend_api: string;
  /** How backend_api is known. */
  readonly backend_api_source: string;
  /** Why it cannot hand out adapters at all (failed to load); undefined when it loaded. */
  readonly unavailable?: string;
  /** Asks for an adapter. Never throws: failures come back as `reason`. */
  requestAdapter(options?: GPURequestAdapterOptions): Promise<AdapterResult>;
  /** Adapts a new device to this runtime's WGSL dialect (Dawn: gpu/runtime_wgsl.ts). */
  prepareDevice?(device: GPUDevice): void;
}

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/**
 * A runtime over any `GPU` object (`null`: none). `requestAdapter` passes through and turns a
 * throw or a null into a reason.
 */
export function runtimeFromGpu(
  gpu: GPU | null,
  meta: {
    name: string;
    version?: string;
    flags?: readonly string[];
    backend_api?: string;
    backend_api_source?: string;
    unavailable?: string;
  },
): WebGpuRuntime {
  const unavailable = gpu ? undefined : meta.unavailable ?? `${meta.name}: no GPU object`;
  return {
    name: meta.name,
    version: meta.version ?? "",
    flags: Object.freeze([...(meta.flags ?? [])]),
    backend_api: meta.backend_api ?? "unknown",
    backend_api_source: meta.backend_api_source ?? "not reported by WebGPU",
    unavailable,
    async requestAdapter(options) {
      if (!gpu) return { adapter: null, reason: unavailable };
      try {
        const adapter = await gpu.requestAdapter(options);
        return adapter
          ? { adapter }
          : { adapter: null, reason: "requestAdapter returned null: no WebGPU adapter" };
      } catch (e) {
        return { adapter: null, reason: `requestAdapter failed: ${message(e)}` };
      }
    },
  };
}

/**
 * The backend Deno's wgpu uses: `DENO_WEBGPU_BACKEND` when it names one; else, on Linux,
 * Vulkan where a Vulkan driver (ICD) is installed and GL otherwise; Metal on macOS; D3D12 on
 * Windows. WebGPU does not report it, so `source` says how it was inferred.
 */
export function denoBackendApi(): { api: string; source: string } {
  const env = envVar("DENO_WEBGPU_BACKEND");
  if (env && env.trim() !== "") {
    const names = env.split(",").map((s) => s.trim().toLowerCase()).filter(Boolean);
    const norm = names.map((n) => (n === "dx12" ? "d3d12" : n === "vk" ? "vulkan" : n));
    return { api: norm.join(","), source: "DENO_WEBGPU_BACKEND" };
  }
  if (Deno.build.os === "darwin") return { api: "metal", source: "wgpu's default on macOS" };
  if (Deno.build.os === "windows") return { api: "d3d12", source: "wgpu's default on Windows" };
  const icd = hasVulkanIcd();
  if (icd === null) return { api: "vulkan", source: "wgpu's first choice on Linux (unverified)" };
  return icd
    ? { api: "vulkan", source: "wgpu's first choice on Linux; a Vulkan driver is installed" }
    : { api: "gl", source: "no Vulkan driver installed; wgpu falls back to GL" };
}

/** Whether a Vulkan ICD manifest exists; null when the directories cannot be read. */
function hasVulkanIcd(): boolean | null {
  const dirs = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"];
  let readable = false;
  for (const d of dirs) {
    try {
      for (const e of Deno.readDirSync(d)) if (e.name.endsWith(".json")) return true;
      readable = true;
    } catch (e) {
      if (e instanceof Deno.errors.NotFound) readable = true;
    }
  }
  return readable ? false : null;
}

/** Deno's own WebGPU (`navigator.gpu`). */
export function denoRuntime(): WebGpuRuntime {
  const gpu = (globalThis.navigator as Navigator | undefined)?.gpu ?? null;
  const be = denoBackendApi();
  const runtime = runtimeFromGpu(gpu, {
    name: "deno",
    version: Deno.version.deno,
    backend_api: be.api,
    backend_api_source: be.source,
    unavailable: "no WebGPU implementation (navigator.gpu is undefined)",
  });
  // Its read-backs skip the 10 ms sleep where that was checked (gpu/map_read.ts).
  return { ...runtime, prepareDevice: (d) => void markDenoDevice(d, Deno.version.deno) };
}

/** Loads one runtime by name (Dawn with `dawnFlags`); failures show as `unavailable`. */
export type RuntimeLoader = (name: RuntimeName, dawnFlags: readonly string[]) => Promise<
  WebGpuRuntime
>;

/** The real loader: `navigator.gpu` for deno, npm `webgpu` for dawn. */
export const loadRuntime: RuntimeLoader = (name, dawnFlags) =>
  name === "dawn" ? loadDawnRuntime(dawnFlags) : Promise.resolve(denoRuntime());

/** A chosen runtime and what the choice learned about the others. */
export interface RuntimeSelection {
  runtime: WebGpuRuntime;
  requested: RuntimeChoice;
  /** Why this runtime: "requested", or what auto found. */
  because: string;
  /** The runtimes not chosen that the choice probed (auto probes Dawn). */
  others: Record<string, RuntimeProbeReport>;
  /** Dawn's flags, for probing Dawn later when it was not chosen. */
  dawnFlags: readonly string[];
  /** `auto` choosing Dawn: what its probe found (for {@link autoWithoutDawn} to report). */
  probe?: RuntimeProbeReport;
}

/**
 * Resolves the choice. `deno` and `dawn` load that runtime (a Dawn that fails to load comes
 * back with `unavailable` set: the caller decides to exit). `auto` loads Dawn and asks it for
 * an adapter: a hardware one picks Dawn; otherwise Deno's runtime, with Dawn's reason in
 * `others.dawn`. Whether Dawn then makes a device is known only once asked: where it does not,
 * {@link autoWithoutDawn} turns the choice to Deno's runtime (gpu/device.ts acquireSelected).
 */
export async function selectRuntime(
  opts: RuntimeOptions,
  load: RuntimeLoader = loadRuntime,
): Promise<RuntimeSelection> {
  const common = { requested: opts.choice, dawnFlags: [...opts.dawnFlags] };
  if (opts.choice !== "auto") {
    const runtime = await load(opts.choice, opts.dawnFlags);
    return { ...common, runtime, because: `requested ${opts.choice}`, others: {} };
  }
  const dawn = await load("dawn", opts.dawnFlags);
  const { software, ...probe } = await probeRuntime(dawn);
  if (probe.available && !software) {
    return {
      ...common,
      runtime: dawn,
      because: `auto: Dawn found a hardware adapter, ${describeAdapter(probe.adapter!)}`,
      others: {},
      probe,
    };
  }
  const why = probe.available
    ? `Dawn's adapter is a software one, ${
      describeAdapter(probe.adapter!)
    }; auto picks Dawn only on hardware`
    : probe.reason!;
  return denoInstead(common, probe, why, load);
}

/** `auto`'s choice of Deno's runtime, with why not Dawn in `because` and `others.dawn`. */
async function denoInstead(
  common: { requested: RuntimeChoice; dawnFlags: readonly string[] },
  dawn: RuntimeProbeReport,
  why: string,
  load: RuntimeLoader,
): Promise<RuntimeSelection> {
  return {
    ...common,
    runtime: await load("deno", common.dawnFlags),
    because: `auto: not Dawn (${why})`,
    others: { dawn: { ...dawn, reason: why } },
  };
}

/**
 * `auto` chose Dawn on a hardware adapter and Dawn then made no device (`reason`, the device
 * manager's): Deno's runtime instead, with Dawn's adapter and why in `others.dawn` and
 * `because`, which `GET /v1/device` reports. Any other selection comes back as it is (an
 * explicit `dawn` that cannot start is the caller's to refuse).
 */
export function autoWithoutDawn(
  sel: RuntimeSelection,
  reason: string,
  load: RuntimeLoader = loadRuntime,
): Promise<RuntimeSelection> {
  if (sel.requested !== "auto" || sel.runtime.name !== "dawn") return Promise.resolve(sel);
  const probe = sel.probe ?? { available: false };
  const found = probe.adapter
    ? `Dawn found a hardware adapter, ${describeAdapter(probe.adapter)}, but`
    : "Dawn";
  const why = `${found} could not create a device: ${reason}`;
  return denoInstead({ requested: sel.requested, dawnFlags: sel.dawnFlags }, probe, why, load);
}
