/**
 * One-line summaries of a {@link DeviceReport} for logs (the server's start-up line, the
 * bench's header): the runtime with its version, the backend API, the adapter with vendor
 * and architecture, the features that matter to the kernels, and how the runtime was chosen.
 * @module
 */
import type { DeviceReport } from "../core/types.ts";
import { describeAdapter } from "./runtime_adapter.ts";

/** Features worth a mention in a one-line summary. */
const NOTABLE_FEATURES = [
  "shader-f16",
  "subgroups",
  "timestamp-query",
  "chromium-experimental-subgroup-matrix",
];

/** "dawn 0.6.2 (vulkan)" */
export function runtimeLabel(r: DeviceReport): string {
  const v = r.runtime_version ? ` ${r.runtime_version}` : "";
  const api = r.backend_api ? ` (${r.backend_api})` : "";
  return `${r.runtime}${v}${api}`;
}

/** The device in one line, or why there is none. */
export function deviceSummary(r: DeviceReport): string {
  const how = r.selection ? `; ${r.selection}` : "";
  if (!r.available) return `no device on ${runtimeLabel(r)}: ${r.reason ?? "no adapter"}${how}`;
  const feats = NOTABLE_FEATURES.filter((f) => r.features.includes(f));
  const sm = r.adapter?.subgroup_matrix_configs;
  const smText = sm && sm.length
    ? `; subgroup-matrix ${
      sm.map((c) => `${c.component_type}->${c.result_component_type} ${c.m}x${c.n}x${c.k}`)
        .join(", ")
    }`
    : "";
  const adapter = r.adapter ? describeAdapter(r.adapter) : "adapter";
  const early = r.readback === "early"
    ? `; read-back as soon as the GPU is done${
      r.readback_deferred ? ", after the other ready calls' host work" : ""
    }`
    : "";
  return `${runtimeLabel(r)}: ${adapter}; ${
    feats.join(", ") || "no optional features"
  }${smText}${early}${how}`;
}

/** One line per runtime not chosen: whether it could start here and why it was not used. */
export function otherRuntimesSummary(r: DeviceReport): string[] {
  return Object.entries(r.other_runtimes ?? {}).map(([name, o]) => {
    const v = o.version ? ` ${o.version}` : "";
    const state = o.available
      ? `available${o.adapter ? ` (${describeAdapter(o.adapter)})` : ""}`
      : "unavailable";
    return `${name}${v}: ${state}${o.reason ? `: ${o.reason}` : ""}`;
  });
}
