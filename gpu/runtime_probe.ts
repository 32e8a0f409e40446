/**
 * Whether a runtime could start here, found cheaply: it is loaded and asked for an adapter,
 * never for a device, and the adapter is dropped. {@link OtherRuntimes} keeps what was found
 * about the runtimes not chosen, for `GET /v1/device`'s `other_runtimes`.
 * @module
 */
import type { AdapterInfoReport, RuntimeProbeReport } from "../core/types.ts";
import type { RuntimeLoader, RuntimeSelection, WebGpuRuntime } from "./runtime.ts";
import { adapterInfoOf, isSoftwareAdapter } from "./runtime_adapter.ts";
import { DEFAULT_DAWN_FLAGS, RUNTIME_NAMES } from "./runtime_options.ts";

/** What {@link probeRuntime} found, with the adapter's info when there is one. */
export interface RuntimeProbe extends RuntimeProbeReport {
  /** True when the adapter found is a software (CPU) one. */
  software?: boolean;
}

/** Asks `rt` for an adapter and reports it; the adapter is dropped, no device is made. */
export async function probeRuntime(
  rt: WebGpuRuntime,
  powerPreference: GPUPowerPreference = "high-performance",
): Promise<RuntimeProbe> {
  const base: RuntimeProbe = {
    available: false,
    version: rt.version,
    flags: [...rt.flags],
    backend_api: rt.backend_api,
  };
  if (rt.unavailable) return { ...base, reason: rt.unavailable };
  const r = await rt.requestAdapter({ powerPreference });
  if (!r.adapter) return { ...base, reason: r.reason ?? "no adapter" };
  const adapter: AdapterInfoReport = adapterInfoOf(r.adapter);
  return { ...base, available: true, adapter, software: isSoftwareAdapter(adapter) };
}

/** The runtimes not chosen: what selection already learned, and lazy probes of the rest. */
export class OtherRuntimes {
  readonly #chosen: string;
  readonly #selection: RuntimeSelection | undefined;
  readonly #load: RuntimeLoader;
  readonly #powerPreference: GPUPowerPreference;
  readonly #found: Record<string, RuntimeProbeReport>;
  #probing: Promise<void> | null = null;

  constructor(
    chosen: string,
    selection: RuntimeSelection | undefined,
    load: RuntimeLoader,
    powerPreference: GPUPowerPreference,
  ) {
    this.#chosen = chosen;
    this.#selection = selection;
    this.#load = load;
    this.#powerPreference = powerPreference;
    this.#found = { ...selection?.others };
  }

  /** Probes each runtime not chosen and not known yet, once. Never rejects. */
  probe(): Promise<void> {
    this.#probing ??= (async () => {
      const flags = this.#selection?.dawnFlags ?? DEFAULT_DAWN_FLAGS;
      for (const name of RUNTIME_NAMES) {
        if (name === this.#chosen || this.#found[name]) continue;
        try {
          const rt = await this.#load(name, flags);
          const { software: _, ...p } = await probeRuntime(rt, this.#powerPreference);
          this.#found[name] = p.available ? { ...p, reason: this.#notChosen() } : p;
        } catch (e) {
          this.#found[name] = { available: false, reason: `probe failed: ${e}` };
        }
      }
    })();
    return this.#probing;
  }

  #notChosen(): string {
    const s = this.#selection;
    return `not chosen: ${s ? s.because : `the device manager was given ${this.#chosen}`}`;
  }

  /** Each runtime not chosen: what was found, or "not probed". */
  report(): Record<string, RuntimeProbeReport> {
    const out: Record<string, RuntimeProbeReport> = {};
    for (const name of RUNTIME_NAMES) {
      if (name === this.#chosen) continue;
      out[name] = this.#found[name] ?? { available: false, reason: "not probed" };
    }
    return out;
  }
}
