import assert from "node:assert/strict";
import { NoDeviceProvider, type WebGpuContext, WebGpuDeviceManager } from "../../gpu/device.ts";
import { runtimeFromGpu } from "../../gpu/runtime.ts";
import { DeviceUnavailableError } from "../../core/errors.ts";
import { lostOnDestroyDevice } from "../support/fake_device.ts";
import { newManager, requestAdapter, SELECTION } from "../support/gpu.ts";
import { NO_GPU } from "./helpers.ts";

const RUNTIME = SELECTION.runtime.name;

Deno.test("device: acquire asks for the adapter's own limits and reports them", {
  ignore: NO_GPU,
}, async () => {
  const mgr = newManager();
  assert.equal(mgr.current(), null);
  assert.equal(mgr.report().available, false);
  const [a, b] = await Promise.all([mgr.acquire(), mgr.acquire()]);
  assert.ok(a);
  assert.equal(a, b, "concurrent acquires share one device");
  assert.equal(await mgr.acquire(), a);
  const adapter = (await requestAdapter())!;
  assert.equal(a.limits.maxStorageBufferBindingSize, adapter.limits.maxStorageBufferBindingSize);
  assert.equal(a.limits.maxBufferSize, adapter.limits.maxBufferSize);
  assert.equal(
    a.limits.maxStorageBuffersPerShaderStage,
    adapter.limits.maxStorageBuffersPerShaderStage,
  );
  if (adapter.features.has("shader-f16")) assert.ok(a.features.has("shader-f16"));
  const r = mgr.report();
  assert.equal(r.available, true);
  assert.equal(r.runtime, RUNTIME);
  assert.equal(r.generation, 1);
  assert.deepEqual(r.features, [...a.features].sort());
  assert.equal(
    r.limits.maxComputeWorkgroupStorageSize,
    adapter.limits.maxComputeWorkgroupStorageSize,
  );
  assert.equal(typeof r.adapter?.description, "string");
  mgr.close();
  await a.device.lost;
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(a.lost, true, "close() destroys the device");
  assert.equal(mgr.current(), null);
  await assert.rejects(() => mgr.acquire(), closedRefusal, "a closed manager does not re-acquire");
  assert.match(mgr.report().reason ?? "", /closed/);
});

Deno.test("device: loss marks the context lost, fires listeners, re-acquires with generation+1", {
  ignore: NO_GPU,
}, async () => {
  const mgr = newManager();
  const ctx = (await mgr.acquire()) as WebGpuContext;
  let managerHeard = 0, ctxHeard = 0;
  mgr.onLost(() => managerHeard++);
  const heard = new Promise<void>((res) => ctx.onLost(() => (ctxHeard++, res())));
  ctx.device.destroy();
  await heard;
  assert.equal(ctx.lost, true);
  assert.equal(ctxHeard, 1);
  assert.equal(managerHeard, 1);
  assert.equal(mgr.current(), null);
  const rep = mgr.report();
  assert.equal(rep.available, false);
  assert.match(rep.reason ?? "", /lost/);
  const again = await mgr.acquire();
  assert.ok(again && again !== ctx);
  assert.equal(again.generation, 2);
  assert.equal(mgr.report().generation, 2);
  // A listener registered after the loss still runs.
  await new Promise<void>((res) => ctx.onLost(() => res()));
  again.device.destroy();
});

Deno.test("device: retries without subgroups when the device request refuses it", {
  ignore: NO_GPU,
}, async () => {
  const seen: string[][] = [];
  const fake = {
    requestAdapter: async (o?: GPURequestAdapterOptions) => {
      const real = (await SELECTION.runtime.requestAdapter(o)).adapter!;
      return new Proxy(real, {
        get(t, p) {
          if (p === "requestDevice") {
            return (d: GPUDeviceDescriptor) => {
              const f = [...(d.requiredFeatures ?? [])].map(String);
              seen.push(f);
              if (f.includes("subgroups")) {
                return Promise.reject(new TypeError("no subgroups here"));
              }
              return t.requestDevice(d);
            };
          }
          if (p === "features") {
            // Unlisted, as Deno's runtime does on some backends (Dawn lists it).
            return new Set([...t.features].filter((f) => f !== "subgroups"));
          }
          const v = Reflect.get(t, p, t);
          return typeof v === "function" ? v.bind(t) : v;
        },
      });
    },
  } as unknown as GPU;
  const mgr = new WebGpuDeviceManager({ runtime: runtimeFromGpu(fake, { name: "fake" }) });
  const ctx = await mgr.acquire();
  assert.ok(ctx, mgr.report().reason);
  assert.equal(seen.length, 2);
  assert.ok(seen[0].includes("subgroups"));
  assert.ok(!seen[1].includes("subgroups"));
  // Without subgroups requested the device has none, unless the retry asked for subgroup
  // matrices: Dawn enables `subgroups` with them (seen on the H200 and on Mesa 26 lavapipe).
  const implied = seen[1].includes("chromium-experimental-subgroup-matrix");
  assert.equal(ctx.features.has("subgroups"), implied);
  assert.equal(mgr.report().runtime, "fake");
  ctx.device.destroy();
});

Deno.test("device: no adapter, no GPU object, NoDeviceProvider", async () => {
  const none = new WebGpuDeviceManager({
    runtime: runtimeFromGpu(
      { requestAdapter: () => Promise.resolve(null) } as unknown as GPU,
      { name: "fake" },
    ),
  });
  assert.equal(await none.acquire(), null);
  assert.match(none.report().reason ?? "", /no WebGPU adapter/);
  assert.equal(none.report().available, false);
  const missing = new WebGpuDeviceManager({
    runtime: runtimeFromGpu(null, {
      name: "deno",
      unavailable: "no WebGPU implementation (navigator.gpu is undefined)",
    }),
  });
  assert.equal(await missing.acquire(), null);
  assert.match(missing.report().reason ?? "", /navigator\.gpu is undefined/);
  const off = new NoDeviceProvider();
  assert.equal(off.current(), null);
  assert.equal(await off.acquire(), null);
  assert.deepEqual(off.report(), {
    available: false,
    runtime: "none",
    reason: "WebGPU disabled (--no-gpu)",
    features: [],
    limits: {},
    generation: 0,
  });
});

/** A manager over a fake runtime whose devices are lost (asynchronously) once destroyed. */
function fakeManager(): WebGpuDeviceManager {
  const adapter = {
    info: { vendor: "fake", architecture: "", device: "", description: "fake adapter" },
    features: new Set<string>(),
    limits: {},
    requestDevice: () => Promise.resolve(lostOnDestroyDevice("fake")),
  };
  const gpu = { requestAdapter: () => Promise.resolve(adapter) } as unknown as GPU;
  return new WebGpuDeviceManager({ runtime: runtimeFromGpu(gpu, { name: "fake" }) });
}

const closedRefusal = (e: unknown) =>
  e instanceof DeviceUnavailableError && e.status === 503 && e.code === "device_unavailable" &&
  /closed/.test(e.message);

Deno.test("device: straight after close(), current() is null and acquire() refuses", async () => {
  const mgr = fakeManager();
  const ctx = (await mgr.acquire()) as WebGpuContext;
  assert.ok(ctx);
  mgr.close();
  // Before device.lost settles: the closed manager hands out no device.
  assert.equal(ctx.lost, false, "the loss is not seen yet");
  assert.equal(mgr.current(), null);
  await assert.rejects(() => mgr.acquire(), closedRefusal);
  assert.equal(mgr.report().available, false);
  await ctx.device.lost;
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(ctx.lost, true);
  assert.equal(mgr.current(), null);
  await assert.rejects(() => mgr.acquire(), closedRefusal);
  // An acquire in flight when close() comes refuses too (its device is destroyed).
  const other = fakeManager();
  const pending = other.acquire();
  other.close();
  await assert.rejects(() => pending, closedRefusal);
  assert.equal(other.current(), null);
  assert.equal(other.last(), null);
});
