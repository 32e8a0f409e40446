/**
 * The device provider with no device at all ({@link NoDeviceProvider}: `--no-gpu`, or tests of
 * host-only paths).
 * @module
 */
import type { DeviceProvider, DeviceReport, GpuContext } from "../core/types.ts";

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
