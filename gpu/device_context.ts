/**
 * A live WebGPU device as the rest of the service sees it ({@link WebGpuContext}: the device,
 * its adapter's info, the features and limits granted, its generation) and how its loss is
 * watched ({@link WebGpuContext.onLost}, {@link onDeviceLost}).
 * @module
 */
import type { AdapterInfoReport, GpuContext } from "../core/types.ts";
import { numericLimits } from "./runtime_device.ts";

/** Called once when a device is lost. */
export type LostListener = (ctx: GpuContext, info: { reason: string; message: string }) => void;

/** The live device plus what was granted. `lost` flips when the device is lost. */
export class WebGpuContext implements GpuContext {
  readonly device: GPUDevice;
  readonly adapter_info: AdapterInfoReport;
  readonly features: ReadonlySet<string>;
  readonly limits: Readonly<Record<string, number>>;
  readonly generation: number;
  #lost = false;
  #lostInfo: { reason: string; message: string } | null = null;
  #listeners = new Set<LostListener>();

  constructor(
    device: GPUDevice,
    adapterInfo: AdapterInfoReport,
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
