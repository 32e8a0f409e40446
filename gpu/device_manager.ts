/**
 * The owner of one runtime's WebGPU device ({@link WebGpuDeviceManager}): acquires an adapter
 * and a device from the runtime, re-acquires after a loss with a bumped generation, closes the
 * device for good at shutdown, probes the runtimes not chosen, and reports it all
 * (`GET /v1/device`).
 * @module
 */
import { DeviceUnavailableError } from "../core/errors.ts";
import type { DeviceProvider, DeviceReport, GpuContext } from "../core/types.ts";
import {
  denoRuntime,
  loadRuntime,
  type RuntimeLoader,
  type RuntimeSelection,
  type WebGpuRuntime,
} from "./runtime.ts";
import { adapterInfoOf } from "./runtime_adapter.ts";
import { requestFullDevice } from "./runtime_device.ts";
import { OtherRuntimes } from "./runtime_probe.ts";
import { defersReads, readsEarly } from "./map_read.ts";
import { lentOut, lentReturned } from "./lent_count.ts";
import { type LostListener, WebGpuContext } from "./device_context.ts";

/** Options of {@link WebGpuDeviceManager}. */
export interface WebGpuDeviceManagerOptions {
  /** The runtime giving adapters; default Deno's (`navigator.gpu`), or `selection.runtime`. */
  runtime?: WebGpuRuntime;
  /** How the runtime was chosen ({@link selectRuntime}): reported, with the others it probed. */
  selection?: RuntimeSelection;
  /** Loads the runtimes not chosen for {@link WebGpuDeviceManager.probeOtherRuntimes}. */
  load?: RuntimeLoader;
  /** Default "high-performance". */
  powerPreference?: GPUPowerPreference;
}

/**
 * Owns the WebGPU device of one runtime. `acquire()` is idempotent while the device lives;
 * after a loss, `current()` is null until the next `acquire()`, which gets a new device
 * (generation + 1). `close()` destroys the device for good: from then on `current()` is null
 * and `acquire()` refuses (503 `device_unavailable`), without waiting for the device's loss.
 */
export class WebGpuDeviceManager implements DeviceProvider {
  readonly runtime: WebGpuRuntime;
  readonly powerPreference: GPUPowerPreference;
  readonly #selection: RuntimeSelection | undefined;
  #ctx: WebGpuContext | null = null;
  #generation = 0;
  #reason: string | undefined;
  #warnings: string[] = [];
  #closed = false;
  #pending: Promise<GpuContext | null> | null = null;
  #listeners = new Set<LostListener>();
  readonly #others: OtherRuntimes;

  constructor(opts: WebGpuDeviceManagerOptions = {}) {
    this.#selection = opts.selection;
    this.runtime = opts.runtime ?? opts.selection?.runtime ?? denoRuntime();
    this.powerPreference = opts.powerPreference ?? "high-performance";
    this.#others = new OtherRuntimes(
      this.runtime.name,
      opts.selection,
      opts.load ?? loadRuntime,
      this.powerPreference,
    );
    this.#reason = this.runtime.unavailable;
  }

  /** The live device, or null (never acquired, none available, lost, or closed). */
  current(): GpuContext | null {
    return this.#ctx && !this.#ctx.lost && !this.#closed ? this.#ctx : null;
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

  /**
   * Acquires a device unless a live one exists; null when there is no adapter.
   * @throws DeviceUnavailableError 503 once closed (an acquire in flight then refuses too).
   */
  acquire(): Promise<GpuContext | null> {
    if (this.#closed) return Promise.reject(closedError());
    const live = this.current();
    if (live) return Promise.resolve(live);
    if (!this.#pending) {
      this.#pending = this.#acquire().finally(() => {
        this.#pending = null;
      });
    }
    return this.#pending;
  }

  /**
   * Destroys the device and stops re-acquiring (shutdown, end of a test file). While answers
   * lent a mapped read-back are still being written out (gpu/readback_memory.ts: a slow client
   * past the shutdown deadline), the device waits for them: destroying it would free the
   * mapping under the write (the process may exit first, which ends the write instead).
   */
  close(): void {
    this.#closed = true;
    this.#reason = "device manager closed";
    const c = this.#ctx;
    if (!c || c.lost) return;
    if (lentOut() === 0) c.device.destroy();
    else lentReturned().then(() => c.device.destroy());
  }

  async #acquire(): Promise<GpuContext | null> {
    const r = await this.runtime.requestAdapter({ powerPreference: this.powerPreference });
    this.#warnings = r.warnings ?? [];
    if (!r.adapter) {
      this.#reason = r.reason ?? "no WebGPU adapter";
      return null;
    }
    const adapter = r.adapter;
    const device = await requestFullDevice(adapter, `attn-device-${this.#generation + 1}`);
    if (typeof device === "string") {
      this.#reason = device;
      return null;
    }
    if (this.#closed) {
      device.destroy();
      throw closedError();
    }
    try {
      this.runtime.prepareDevice?.(device);
    } catch (e) {
      device.destroy(); // e.g. a refused ATTN_EARLY_READ: no device left behind per acquire
      throw e;
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

  /**
   * Probes each runtime not chosen, once, for the report's `other_runtimes`: it is loaded
   * and asked for an adapter, never for a device (so this loads Dawn when Deno's runtime
   * was chosen). Never rejects.
   */
  probeOtherRuntimes(): Promise<void> {
    return this.#others.probe();
  }

  /** What `GET /v1/device` reports. */
  report(): DeviceReport {
    const c = this.#ctx;
    const rt = this.runtime;
    const live = c !== null && !c.lost && !this.#closed;
    return {
      available: live,
      runtime: rt.name,
      runtime_version: rt.version,
      runtime_flags: [...rt.flags],
      selection: this.#selection?.because ?? `given ${rt.name}`,
      backend_api: rt.backend_api,
      backend_api_source: rt.backend_api_source,
      ...(live ? {} : { reason: this.#unavailableReason(c) }),
      ...(c ? { adapter: c.adapter_info } : {}),
      features: live ? [...c.features].sort() : [],
      limits: live ? { ...c.limits } : {},
      generation: this.#generation,
      ...(live
        ? {
          readback: readsEarly(c.device) ? "early" as const : "awaited" as const,
          readback_deferred: defersReads(c.device),
        }
        : {}),
      ...(this.#warnings.length ? { warnings: [...this.#warnings] } : {}),
      other_runtimes: this.#others.report(),
    };
  }

  #unavailableReason(c: WebGpuContext | null): string {
    if (this.#closed || !c?.lost) return this.#reason ?? "no device acquired yet";
    const m = c.lostInfo?.message ? `: ${c.lostInfo.message}` : "";
    return `device lost (${
      c.lostInfo?.reason ?? "unknown"
    }${m}); it is re-acquired on the next request`;
  }
}

/** What a closed manager's `acquire()` refuses with. */
const closedError = () => new DeviceUnavailableError("the WebGPU device manager was closed");
