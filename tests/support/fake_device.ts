/**
 * A stand-in GPUDevice for tests of what watches a device's life (plan caches, device managers):
 * no features, no limits, and a `lost` promise that settles when the device is destroyed.
 * @module
 */

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
