/**
 * The WebGPU device layer: acquires an adapter and a device from any `GPU` object (Deno's
 * `navigator.gpu` by default), asks for every limit at the adapter's own value and for the
 * optional features the kernels can use (`shader-f16`, `timestamp-query`, `subgroups`),
 * watches for device loss and re-acquires on demand with a bumped generation.
 *
 * This is the only module that touches `navigator.gpu`; everything else receives a
 * {@link GpuContext}.
 * @module
 */
import type { DeviceProvider, DeviceReport, GpuContext } from "../core/types.ts";

/** Optional features requested when the adapter offers them. */
export const WANTED_FEATURES = ["shader-f16", "timestamp-query"] as const;

/**
 * Requested even when the adapter does not list it (Deno hides `subgroups` from
 * `adapter.features` on some backends yet grants it); the request is retried without it.
 */
export const OPPORTUNISTIC_FEATURES = ["subgroups"] as const;

/** Called once when a device is lost. */
export type LostListener = (ctx: GpuContext, info: { reason: string; message: string }) => void;

/** Options of {@link WebGpuDeviceManager}. */
export interface WebGpuDeviceManagerOptions {
  /** The WebGPU entry point; default `navigator.gpu` (which may be undefined). null: none. */
  gpu?: GPU | null;
  /** Which implementation this is, for the report (default "deno"). */
  runtime?: string;
  /** Default "high-performance". */
  powerPreference?: GPUPowerPreference;
}

/** The live device plus what was granted. `lost` flips when the device is lost. */
export class WebGpuContext implements GpuContext {
  readonly device: GPUDevice;
  readonly adapter_info: GpuContext["adapter_info"];
  readonly features: ReadonlySet<string>;
  readonly limits: Readonly<Record<string, number>>;
  readonly generation: number;
  #lost = false;
  #lostInfo: { reason: string; message: string } | null = null;
  #listeners = new Set<LostListener>();

  constructor(
    device: GPUDevice,
    adapterInfo: GpuContext["adapter_info"],
    generation: number,
  ) {
    this.device = device;
    this.adapter_info = adapterInfo;
    this.features = new Set([...device.features]);
    this.limits = Object.freeze(numericLimits(device.limits));
    this.generation = generation;
    device.lost.then((info) => this.markLost(String(info.reason ?? "unknown"), info.message ?? ""));
  }

  /** True once the device was lost (or destroyed). */
  get lost(): boolean {
    return this.#lost;
  }

  /** Why the device was lost, once it was. */
  get lostInfo(): { reason: string; message: string } | null {
    return this.#lostInfo;
  }

  /**
   * Registers a listener for the loss of this device; runs at once (asynchronously) if it is
   * already lost. Returns a function that unregisters it.
   */
  onLost(cb: LostListener): () => void {
    if (this.#lost) {
      const info = this.#lostInfo!;
      queueMicrotask(() => cb(this, info));
      return () => {};
    }
    this.#listeners.add(cb);
    return () => this.#listeners.delete(cb);
  }

  /** Marks the context lost and fires the listeners (idempotent). */
  markLost(reason: string, message: string): void {
    if (this.#lost) return;
    this.#lost = true;
    this.#lostInfo = { reason, message };
    const ls = [...this.#listeners];
    this.#listeners.clear();
    for (const cb of ls) {
      try {
        cb(this, this.#lostInfo);
      } catch (e) {
        console.error("device-lost listener failed:", e);
      }
    }
  }
}

/**
 * Calls `cb` when the device behind `ctx` is lost: through {@link WebGpuContext.onLost} when
 * `ctx` is one, else through `device.lost`. Returns an unregister function.
 */
export function onDeviceLost(ctx: GpuContext, cb: () => void): () => void {
  if (ctx instanceof WebGpuContext) return ctx.onLost(() => cb());
  let live = true;
  ctx.device.lost.then(() => {
    if (live) cb();
  });
  return () => {
    live = false;
  };
}

/** Every numeric entry of a GPUSupportedLimits (own and prototype getters). */
export function numericLimits(l: GPUSupportedLimits): Record<string, number> {
  const out: Record<string, number> = {};
  const keys = new Set<string>(Object.keys(l));
  for (
    let p = Object.getPrototypeOf(l);
    p && p !== Object.prototype;
    p = Object.getPrototypeOf(p)
  ) {
    for (const k of Object.getOwnPropertyNames(p)) keys.add(k);
  }
  for (const k of keys) {
    if (k === "constructor") continue;
    const v = (l as unknown as Record<string, unknown>)[k];
    if (typeof v === "number" && Number.isFinite(v)) out[k] = v;
  }
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => a.localeCompare(b)));
}

function adapterInfoOf(adapter: GPUAdapter): GpuContext["adapter_info"] {
  const i = (adapter.info ?? {}) as GPUAdapterInfo & {
    subgroupMinSize?: number;
    subgroupMaxSize?: number;
    isFallbackAdapter?: boolean;
  };
  const info: GpuContext["adapter_info"] = {
    vendor: String(i.vendor ?? ""),
    architecture: String(i.architecture ?? ""),
    device: String(i.device ?? ""),
    description: String(i.description ?? ""),
  };
  if (typeof i.subgroupMinSize === "number") info.subgroup_min_size = i.subgroupMinSize;
  if (typeof i.subgroupMaxSize === "number") info.subgroup_max_size = i.subgroupMaxSize;
  const fb = i.isFallbackAdapter ?? (adapter as { isFallbackAdapter?: boolean }).isFallbackAdapter;
  if (typeof fb === "boolean") info.is_fallback_adapter = fb;
  return info;
}

function defaultGpu(): GPU | null {
  return (globalThis.navigator as Navigator | undefined)?.gpu ?? null;
}

/**
 * Owns the WebGPU device. `acquire()` is idempotent while the device lives; after a loss,
 * `current()` is null until the next `acquire()`, which gets a new device (generation + 1).
 */
export class WebGpuDeviceManager implements DeviceProvider {
  readonly runtime: string;
  readonly powerPreference: GPUPowerPreference;
  #gpu: GPU | null;
  #ctx: WebGpuContext | null = null;
  #generation = 0;
  #reason: string | undefined;
  #pending: Promise<GpuContext | null> | null = null;
  #listeners = new Set<LostListener>();

  constructor(opts: WebGpuDeviceManagerOptions = {}) {
    this.#gpu = opts.gpu === undefined ? defaultGpu() : opts.gpu;
    this.runtime = opts.runtime ?? "deno";
    this.powerPreference = opts.powerPreference ?? "high-performance";
    if (!this.#gpu) this.#reason = "no WebGPU implementation (navigator.gpu is undefined)";
  }

  /** The live device, or null (never acquired, none available, or lost). */
  current(): GpuContext | null {
    return this.#ctx && !this.#ctx.lost ? this.#ctx : null;
  }

  /** The last context acquired, lost or not (for tests and diagnostics). */
  last(): WebGpuContext | null {
    return this.#ctx;
  }

  /**
   * Registers a listener fired when any device this manager acquired is lost (GPU caches use
   * it to mark themselves lost). Returns an unregister function.
   */
  onLost(cb: LostListener): () => void {
    this.#listeners.add(cb);
    return () => this.#listeners.delete(cb);
  }

  /** Acquires a device unless a live one exists; null when there is no adapter. */
  acquire(): Promise<GpuContext | null> {
    const live = this.current();
    if (live) return Promise.resolve(live);
    if (!this.#pending) {
      this.#pending = this.#acquire().finally(() => {
        this.#pending = null;
      });
    }
    return this.#pending;
  }

  async #acquire(): Promise<GpuContext | null> {
    const gpu = this.#gpu;
    if (!gpu) return null;
    let adapter: GPUAdapter | null;
    try {
      adapter = await gpu.requestAdapter({ powerPreference: this.powerPreference });
    } catch (e) {
      this.#reason = `requestAdapter failed: ${e instanceof Error ? e.message : e}`;
      return null;
    }
    if (!adapter) {
      this.#reason = "requestAdapter returned null: no WebGPU adapter on this machine";
      return null;
    }
    const requiredLimits = numericLimits(adapter.limits);
    const listed: string[] = WANTED_FEATURES.filter((f) => adapter.features.has(f));
    const attempts = [
      [...listed, ...OPPORTUNISTIC_FEATURES],
      [...listed, ...OPPORTUNISTIC_FEATURES.filter((f) => adapter.features.has(f))],
    ];
    if (attempts[1].length === attempts[0].length) attempts.pop();
    let device: GPUDevice | null = null;
    let lastErr: unknown = null;
    for (const features of attempts) {
      try {
        device = await adapter.requestDevice({
          requiredFeatures: features as GPUFeatureName[],
          requiredLimits,
          label: `attn-device-${this.#generation + 1}`,
        });
        break;
      } catch (e) {
        lastErr = e;
      }
    }
    if (!device) {
      this.#reason = `requestDevice failed: ${
        lastErr instanceof Error ? lastErr.message : lastErr
      }`;
      return null;
    }
    this.#generation++;
    const ctx = new WebGpuContext(device, adapterInfoOf(adapter), this.#generation);
    ctx.onLost((c, info) => {
      for (const cb of [...this.#listeners]) {
        try {
          cb(c, info);
        } catch (e) {
          console.error("device-lost listener failed:", e);
        }
      }
    });
    this.#ctx = ctx;
    this.#reason = undefined;
    return ctx;
  }

  /** What `GET /v1/device` reports. */
  report(): DeviceReport {
    const c = this.#ctx;
    if (!c || c.lost) {
      const reason = c?.lost
        ? `device lost (${c.lostInfo?.reason ?? "unknown"}${
          c.lostInfo?.message ? `: ${c.lostInfo.message}` : ""
        }); it is re-acquired on the next request`
        : this.#reason ?? "no device acquired yet";
      return {
        available: false,
        runtime: this.runtime,
        reason,
        ...(c ? { adapter: c.adapter_info } : {}),
        features: [],
        limits: {},
        generation: this.#generation,
      };
    }
    return {
      available: true,
      runtime: this.runtime,
      adapter: c.adapter_info,
      features: [...c.features].sort(),
      limits: { ...c.limits },
      generation: this.#generation,
    };
  }
}

/** A provider with no device at all (`--no-gpu`, or tests of host-only paths). */
export class NoDeviceProvider implements DeviceProvider {
  readonly reason: string;
  readonly runtime: string;
  /** @param reason why there is no device (reported at GET /v1/device). */
  constructor(reason = "WebGPU disabled (--no-gpu)", runtime = "none") {
    this.reason = reason;
    this.runtime = runtime;
  }
  /** Always null. */
  current(): GpuContext | null {
    return null;
  }
  /** Always null. */
  acquire(): Promise<GpuContext | null> {
    return Promise.resolve(null);
  }
  /** An unavailable report naming the reason. */
  report(): DeviceReport {
    return {
      available: false,
      runtime: this.runtime,
      reason: this.reason,
      features: [],
      limits: {},
      generation: 0,
    };
  }
}
