/**
 * The Dawn runtime itself (npm `webgpu`), loaded whatever ATTN_WEBGPU_RUNTIME says. Where
 * Dawn finds no adapter (this project's CPU machines: Mesa 22.3's lavapipe lacks
 * shaderUniform*ArrayDynamicIndexing) the tests that need one are skipped with Dawn's own
 * reason, printed, and the reason itself is tested; where it finds one (Mesa 25 in the trixie
 * chroot, the H200) they run: the device's limits and features, the WGSL dialect shim, loss
 * and re-acquire, the completion round trip, and a clean close.
 */
import assert from "node:assert/strict";
import { DeviceUnavailableError } from "../../core/errors.ts";
import { type WebGpuContext, WebGpuDeviceManager } from "../../gpu/device.ts";
import { selectRuntime } from "../../gpu/runtime.ts";
import { loadDawnRuntime } from "../../gpu/runtime_dawn.ts";
import { completionRoundTrip } from "../../gpu/runtime_device.ts";
import { DEFAULT_DAWN_FLAGS } from "../../gpu/runtime_options.ts";
import { dispatchIntoBuffer } from "../support/dispatch.ts";

const FLAGS = [...DEFAULT_DAWN_FLAGS];
const DAWN = await loadDawnRuntime(FLAGS);
const PROBE = await DAWN.requestAdapter({ powerPreference: "high-performance" });
/** True where Dawn has no adapter: its tests are skipped. */
const NO_DAWN = PROBE.adapter === null;
if (NO_DAWN) console.warn(`Dawn runtime tests skipped: ${PROBE.reason}`);

const selection = {
  runtime: DAWN,
  requested: "dawn" as const,
  because: "test",
  others: {},
  dawnFlags: FLAGS,
};

Deno.test("dawn: with no adapter, the reason is Dawn's own, everywhere it shows", {
  ignore: !NO_DAWN,
}, async () => {
  const reason = PROBE.reason ?? "";
  if (!DAWN.unavailable) {
    assert.match(reason, /^Dawn found no adapter: /);
    if (Deno.build.os === "linux") {
      // What Dawn printed, captured: not the placeholder used when nothing was printed.
      assert.doesNotMatch(reason, /printed no reason|went to stderr/);
      assert.ok(PROBE.warnings && PROBE.warnings.length > 0, reason);
    }
  }
  const mgr = new WebGpuDeviceManager({ selection });
  assert.equal(await mgr.acquire(), null);
  assert.equal(mgr.report().reason, reason);
  assert.equal(mgr.report().runtime, "dawn");
  const auto = await selectRuntime({ choice: "auto", dawnFlags: FLAGS });
  assert.equal(auto.runtime.name, "deno");
  assert.equal(auto.others.dawn.available, false);
  assert.equal(auto.others.dawn.reason, reason);
  assert.equal(auto.because, `auto: not Dawn (${reason})`);
});

Deno.test("dawn: device with the adapter's limits and the wanted features", {
  ignore: NO_DAWN,
}, async () => {
  const mgr = new WebGpuDeviceManager({ selection });
  const ctx = (await mgr.acquire())!;
  try {
    assert.ok(ctx, mgr.report().reason);
    const adapter = PROBE.adapter!;
    assert.equal(
      ctx.limits.maxStorageBufferBindingSize,
      adapter.limits.maxStorageBufferBindingSize,
    );
    assert.equal(
      ctx.limits.maxStorageBuffersPerShaderStage,
      adapter.limits.maxStorageBuffersPerShaderStage,
    );
    assert.equal(ctx.limits.maxBufferSize, adapter.limits.maxBufferSize);
    for (
      const f of [
        "shader-f16",
        "subgroups",
        "timestamp-query",
        "chromium-experimental-subgroup-matrix",
      ]
    ) {
      if (adapter.features.has(f as GPUFeatureName)) assert.ok(ctx.features.has(f), f);
    }
    const r = mgr.report();
    assert.equal(r.runtime, "dawn");
    assert.equal(r.runtime_version, "0.6.2");
    assert.deepEqual(r.runtime_flags, FLAGS);
    assert.equal(r.backend_api, Deno.build.os === "linux" ? "vulkan" : r.backend_api);
    assert.ok(Array.isArray(r.adapter?.subgroup_matrix_configs));
    if (ctx.features.has("chromium-experimental-subgroup-matrix")) {
      assert.ok(r.adapter!.subgroup_matrix_configs!.length > 0);
    }
  } finally {
    mgr.close();
  }
});

Deno.test("dawn: subgroup builtins compile without `enable subgroups;` in the source", {
  ignore: NO_DAWN,
}, async () => {
  const mgr = new WebGpuDeviceManager({ selection });
  const ctx = (await mgr.acquire())!;
  try {
    if (!ctx.features.has("subgroups")) return;
    const dev = ctx.device;
    const code = `@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) {
  o[i] = subgroupAdd(1u) + subgroupBroadcastFirst(i) * 0u;
}`;
    dev.pushErrorScope("validation");
    const module = dev.createShaderModule({ code });
    const info = await module.getCompilationInfo();
    assert.equal((await dev.popErrorScope())?.message, undefined);
    assert.deepEqual(info.messages.filter((m) => m.type === "error").map((m) => m.message), []);
    const pipeline = await dev.createComputePipelineAsync({
      layout: "auto",
      compute: { module, entryPoint: "main" },
    });
    const got = new Uint32Array(await dispatchIntoBuffer(dev, pipeline, 256));
    // Every lane holds its subgroup's size, which the adapter bounds.
    const min = ctx.adapter_info.subgroup_min_size ?? 1;
    const max = ctx.adapter_info.subgroup_max_size ?? 128;
    for (const v of got) assert.ok(v >= min && v <= max && v === got[0], `${[...got]}`);
  } finally {
    mgr.close();
  }
});

Deno.test("dawn: loss marks the context lost, re-acquires with generation+1, close ends it", {
  ignore: NO_DAWN,
}, async () => {
  const mgr = new WebGpuDeviceManager({ selection });
  const ctx = (await mgr.acquire()) as WebGpuContext;
  let heard = 0;
  mgr.onLost(() => heard++);
  const lost = new Promise<void>((res) => ctx.onLost(() => res()));
  ctx.device.destroy();
  await lost;
  assert.equal(ctx.lost, true);
  assert.equal(heard, 1);
  assert.match(mgr.report().reason ?? "", /lost/);
  const again = (await mgr.acquire())!;
  assert.equal(again.generation, 2);
  mgr.close();
  assert.equal(mgr.current(), null, "closed: no device even before the loss settles");
  await again.device.lost;
  await assert.rejects(() => mgr.acquire(), DeviceUnavailableError);
});

Deno.test("dawn: completion round trip (empty submit + 16 B mapAsync)", {
  ignore: NO_DAWN,
}, async () => {
  const mgr = new WebGpuDeviceManager({ selection });
  const ctx = (await mgr.acquire())!;
  try {
    const { ms, words } = await completionRoundTrip(ctx.device, 50);
    assert.deepEqual(words, [1, 2, 3, 4]);
    const sorted = [...ms].sort((a, b) => a - b);
    console.log(
      `dawn round trip: median ${sorted[25].toFixed(3)} ms, min ${sorted[0].toFixed(3)} ms ` +
        `(${ctx.adapter_info.description})`,
    );
  } finally {
    mgr.close();
  }
});
