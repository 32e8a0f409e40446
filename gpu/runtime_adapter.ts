/**
 * What an adapter says about itself, the same on every runtime: `GPUAdapterInfo` made into a
 * plain record (vendor, architecture, device, description, subgroup sizes, fallback flag,
 * Dawn's subgroup-matrix configurations), a vendor name where the runtime gives a PCI or
 * Khronos vendor id (Deno's gives "65541" for Mesa), and whether the adapter is software.
 * @module
 */
import type { AdapterInfoReport, SubgroupMatrixConfig } from "../core/types.ts";

/** PCI and Khronos (VK_VENDOR_ID_*) vendor ids WebGPU implementations report. */
const VENDOR_IDS: Readonly<Record<number, string>> = {
  0x1002: "amd",
  0x1010: "imagination",
  0x106b: "apple",
  0x10de: "nvidia",
  0x13b5: "arm",
  0x1414: "microsoft",
  0x1ae0: "google",
  0x5143: "qualcomm",
  0x8086: "intel",
  0x10001: "vivante",
  0x10002: "vsi",
  0x10003: "kazan",
  0x10004: "codeplay",
  0x10005: "mesa",
  0x10006: "pocl",
  0x10007: "mobileye",
};

/** The vendor's name: the string itself when it is one, else the name of a known id. */
export function vendorName(vendor: string): string | undefined {
  const v = vendor.trim();
  if (v === "") return undefined;
  if (!/^(0x[0-9a-f]+|\d+)$/i.test(v)) return v.toLowerCase();
  return VENDOR_IDS[Number(v)];
}

/** Software rasterizers by name (Mesa's llvmpipe/lavapipe/softpipe, SwiftShader, WARP). */
const SOFTWARE_NAME = /llvmpipe|lavapipe|softpipe|swiftshader|\bwarp\b|microsoft basic render/i;

/** True when the adapter is a CPU/software one (its fallback flag, its architecture or name). */
export function isSoftwareAdapter(info: AdapterInfoReport): boolean {
  return info.is_fallback_adapter === true || info.architecture.toLowerCase() === "software" ||
    SOFTWARE_NAME.test(`${info.description} ${info.device}`);
}

/** Every readable property of an object (own and prototype getters), as a plain record. */
function ownAndProtoValues(o: object): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (let p: object | null = o; p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
    for (const k of Object.getOwnPropertyNames(p)) {
      if (k === "constructor" || k in out) continue;
      try {
        const v = (o as Record<string, unknown>)[k];
        if (typeof v !== "function") out[k] = v;
      } catch { /* a getter that throws: skip */ }
    }
  }
  return out;
}

/** Dawn's `GPUSubgroupMatrixConfig` list as plain records; undefined when there is none. */
export function subgroupMatrixConfigs(raw: unknown): SubgroupMatrixConfig[] | undefined {
  if (raw === undefined || raw === null || typeof raw !== "object") return undefined;
  const list = Array.from(raw as Iterable<unknown>);
  return list.map((c) => {
    const v = ownAndProtoValues(c as object);
    return {
      component_type: String(v.componentType ?? ""),
      result_component_type: String(v.resultComponentType ?? ""),
      m: Number(v.M ?? 0),
      n: Number(v.N ?? 0),
      k: Number(v.K ?? 0),
    };
  });
}

/** The adapter's info as reported (`GET /v1/device` `adapter`). */
export function adapterInfoOf(adapter: GPUAdapter): AdapterInfoReport {
  const i = ownAndProtoValues((adapter.info ?? {}) as object);
  const info: AdapterInfoReport = {
    vendor: String(i.vendor ?? ""),
    architecture: String(i.architecture ?? ""),
    device: String(i.device ?? ""),
    description: String(i.description ?? ""),
  };
  const name = vendorName(info.vendor);
  if (name) info.vendor_name = name;
  if (typeof i.subgroupMinSize === "number") info.subgroup_min_size = i.subgroupMinSize;
  if (typeof i.subgroupMaxSize === "number") info.subgroup_max_size = i.subgroupMaxSize;
  const fb = i.isFallbackAdapter ?? (adapter as { isFallbackAdapter?: boolean }).isFallbackAdapter;
  if (typeof fb === "boolean") info.is_fallback_adapter = fb;
  const sm = subgroupMatrixConfigs(i.subgroupMatrixConfigs);
  if (sm) info.subgroup_matrix_configs = sm;
  return info;
}

/** One line naming the adapter: description (or device), vendor, architecture. */
export function describeAdapter(info: AdapterInfoReport): string {
  const name = info.description || info.device || "adapter";
  const vendor = info.vendor_name ?? (info.vendor || "unknown vendor");
  const arch = info.architecture ? `, ${info.architecture}` : "";
  const soft = isSoftwareAdapter(info) && info.architecture.toLowerCase() !== "software";
  return `${name} (${vendor}${arch}${soft ? ", software" : ""})`;
}
