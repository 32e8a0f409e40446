/**
 * Runtime options and selection with fake runtimes (no GPU needed): flag and environment
 * parsing, `deno`/`dawn`/`auto` and the reasons recorded when a runtime is not used (the
 * server's start-up too: an `auto` whose Dawn finds a hardware adapter but makes no device
 * serves on Deno's runtime, saying why), the report fields, and the pure helpers (Dawn's printed messages, backend API, vendor names,
 * software adapters, the subgroups enable shim, stderr capture).
 */
import assert from "node:assert/strict";
import { WebGpuDeviceManager } from "../../gpu/device.ts";
import { runtimeFromGpu, type RuntimeLoader, selectRuntime } from "../../gpu/runtime.ts";
import { isSoftwareAdapter, vendorName } from "../../gpu/runtime_adapter.ts";
import { dawnBackendApi, dawnMessages } from "../../gpu/runtime_dawn.ts";
import {
  DEFAULT_DAWN_FLAGS,
  mergeDawnFlags,
  resolveRuntimeOptions,
  SAFE_DAWN_FLAGS,
  splitDawnFlags,
} from "../../gpu/runtime_options.ts";
import { captureStderr } from "../../gpu/runtime_stderr.ts";
import { acquireDevice } from "../../server/device_setup.ts";
import { enableSubgroups } from "../../gpu/runtime_wgsl.ts";
import { lostOnDestroyDevice } from "../support/fake_device.ts";

const DEFAULT = [...DEFAULT_DAWN_FLAGS];

Deno.test("runtime options: defaults, environment, command line over environment", () => {
  assert.deepEqual(resolveRuntimeOptions({}, {}), { choice: "deno", dawnFlags: DEFAULT });
  assert.deepEqual(
    DEFAULT,
    [
      "enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia,disable_robustness",
      "disable-dawn-features=timestamp_quantization",
    ],
  );
  // The safe list is the default with the robustness transform kept, nothing else changed.
  assert.deepEqual(
    [...SAFE_DAWN_FLAGS],
    DEFAULT.map((f) => f.replace(",disable_robustness", "")),
  );
  assert.notDeepEqual([...SAFE_DAWN_FLAGS], DEFAULT);
  const env = { ATTN_WEBGPU_RUNTIME: "auto", ATTN_DAWN_FLAGS: "backend=vulkan" };
  assert.deepEqual(resolveRuntimeOptions({}, env), {
    choice: "auto",
    dawnFlags: ["backend=vulkan"],
  });
  assert.deepEqual(resolveRuntimeOptions({ runtime: "DAWN" }, env).choice, "dawn");
  assert.deepEqual(resolveRuntimeOptions({ dawnFlags: "" }, env).dawnFlags, []);
  assert.deepEqual(resolveRuntimeOptions({}, { ATTN_WEBGPU_RUNTIME: "" }).choice, "deno");
  assert.throws(
    () => resolveRuntimeOptions({ runtime: "webkit" }, {}),
    /--webgpu-runtime must be one of deno, dawn, auto, got "webkit"/,
  );
  assert.throws(
    () => resolveRuntimeOptions({}, { ATTN_WEBGPU_RUNTIME: "cuda" }),
    /ATTN_WEBGPU_RUNTIME must be one of deno, dawn, auto, got "cuda"/,
  );
});

Deno.test("runtime options: Dawn flag lists split on commas, pieces without = continue", () => {
  assert.deepEqual(splitDawnFlags("enable-dawn-features=a,b,backend=vulkan", "x"), [
    "enable-dawn-features=a,b",
    "backend=vulkan",
  ]);
  assert.deepEqual(splitDawnFlags(" backend=vk , ,adapter=NVIDIA ", "x"), [
    "backend=vk",
    "adapter=NVIDIA",
  ]);
  assert.throws(
    () => splitDawnFlags("verbose", "--dawn-flags"),
    /--dawn-flags: a Dawn flag is KEY=VALUE, got "verbose"/,
  );
  assert.throws(() => splitDawnFlags("=x", "ATTN_DAWN_FLAGS"), /ATTN_DAWN_FLAGS/);
  // --dawn-flag replaces the same key, appends a new one, and adds to a toggle list (it used
  // to replace the list: enable-dawn-features=x dropped the default toggles).
  assert.deepEqual(mergeDawnFlags(["a=1", "b=2"], ["b=3", "c=4"]), ["a=1", "b=3", "c=4"]);
  const o = resolveRuntimeOptions({
    dawnFlag: [
      "backend=vulkan",
      "enable-dawn-features=allow_unsafe_apis,use_dxc",
      "disable-dawn-features=lazy_clear_resource_on_first_use",
    ],
  }, {});
  assert.deepEqual(o.dawnFlags, [
    "enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia,disable_robustness,use_dxc",
    "disable-dawn-features=timestamp_quantization,lazy_clear_resource_on_first_use",
    "backend=vulkan",
  ]);
  assert.throws(
    () => resolveRuntimeOptions({ dawnFlag: ["novalue"] }, {}),
    /--dawn-flag: .*"novalue"/,
  );
});

/** A fake GPU whose adapter has `info`, or none (`reason` printed nowhere). */
function fakeGpu(info: Record<string, unknown> | null): GPU {
  return {
    requestAdapter: () =>
      Promise.resolve(
        info && { info, features: new Set<string>(), limits: {}, isFallbackAdapter: false },
      ),
  } as unknown as GPU;
}

const HARDWARE = {
  vendor: "nvidia",
  architecture: "hopper",
  device: "",
  description: "NVIDIA H200",
  isFallbackAdapter: false,
};
const LAVAPIPE = {
  vendor: "mesa",
  architecture: "software",
  device: "llvmpipe",
  description: "llvmpipe: Mesa 25.0.7",
  isFallbackAdapter: true,
};

/** A loader giving fake runtimes; records what was loaded. */
function fakeLoader(dawn: GPU | string, loaded: string[] = []): RuntimeLoader {
  return (name, flags) => {
    loaded.push(name);
    if (name === "deno") {
      return Promise.resolve(runtimeFromGpu(fakeGpu(LAVAPIPE), { name: "deno", version: "2" }));
    }
    return Promise.resolve(
      typeof dawn === "string"
        ? runtimeFromGpu(null, { name: "dawn", version: "0.6.2", flags, unavailable: dawn })
        : runtimeFromGpu(dawn, { name: "dawn", version: "0.6.2", flags }),
    );
  };
}

Deno.test("runtime selection: explicit deno and dawn load only that runtime", async () => {
  const loaded: string[] = [];
  const d = await selectRuntime({ choice: "deno", dawnFlags: DEFAULT }, fakeLoader("x", loaded));
  assert.equal(d.runtime.name, "deno");
  assert.equal(d.because, "requested deno");
  assert.deepEqual(d.others, {});
  const w = await selectRuntime(
    { choice: "dawn", dawnFlags: ["backend=vulkan"] },
    fakeLoader("cannot load npm:webgpu@0.6.2: Requires ffi access", loaded),
  );
  assert.deepEqual(loaded, ["deno", "dawn"]);
  assert.equal(w.runtime.name, "dawn");
  assert.deepEqual([...w.runtime.flags], ["backend=vulkan"]);
  // A Dawn that cannot start: the manager reports Dawn's reason (serve exits 2 with it).
  const mgr = new WebGpuDeviceManager({ selection: w, load: fakeLoader("x") });
  assert.equal(await mgr.acquire(), null);
  const r = mgr.report();
  assert.equal(r.available, false);
  assert.equal(r.runtime, "dawn");
  assert.equal(r.reason, "cannot load npm:webgpu@0.6.2: Requires ffi access");
  assert.equal(r.selection, "requested dawn");
});

Deno.test("runtime selection: auto picks Dawn on a hardware adapter", async () => {
  const s = await selectRuntime(
    { choice: "auto", dawnFlags: DEFAULT },
    fakeLoader(fakeGpu(HARDWARE)),
  );
  assert.equal(s.runtime.name, "dawn");
  assert.equal(s.requested, "auto");
  assert.match(s.because, /^auto: Dawn found a hardware adapter, NVIDIA H200 \(nvidia, hopper\)$/);
  assert.deepEqual(s.others, {});
});

Deno.test("runtime selection: auto falls back to deno, recording why not Dawn", async () => {
  const soft = await selectRuntime(
    { choice: "auto", dawnFlags: DEFAULT },
    fakeLoader(fakeGpu(LAVAPIPE)),
  );
  assert.equal(soft.runtime.name, "deno");
  assert.equal(soft.others.dawn.available, true);
  assert.match(
    soft.others.dawn.reason!,
    /software one, llvmpipe: Mesa 25\.0\.7 .*only on hardware/,
  );
  assert.equal(soft.others.dawn.adapter?.description, "llvmpipe: Mesa 25.0.7");
  assert.match(soft.because, /^auto: not Dawn \(Dawn's adapter is a software one/);

  const none = await selectRuntime(
    { choice: "auto", dawnFlags: DEFAULT },
    fakeLoader(fakeGpu(null)),
  );
  assert.equal(none.runtime.name, "deno");
  assert.deepEqual(none.others.dawn, {
    available: false,
    version: "0.6.2",
    flags: DEFAULT,
    backend_api: "unknown",
    reason: "requestAdapter returned null: no WebGPU adapter",
  });
  const broken = await selectRuntime(
    { choice: "auto", dawnFlags: DEFAULT },
    fakeLoader("cannot load npm:webgpu@0.6.2: boom"),
  );
  assert.equal(broken.runtime.name, "deno");
  assert.equal(broken.others.dawn.reason, "cannot load npm:webgpu@0.6.2: boom");
  assert.equal(broken.because, "auto: not Dawn (cannot load npm:webgpu@0.6.2: boom)");

  // The manager reports the selection and the reason; probing does not redo Dawn.
  const loaded: string[] = [];
  const mgr = new WebGpuDeviceManager({ selection: broken, load: fakeLoader("y", loaded) });
  const r = mgr.report();
  assert.equal(r.selection, broken.because);
  assert.equal(r.other_runtimes?.dawn.reason, "cannot load npm:webgpu@0.6.2: boom");
  await mgr.probeOtherRuntimes();
  assert.deepEqual(loaded, []);
});

/** A fake GPU whose adapter has `info` and makes a fake device, or fails with `refuse`. */
function deviceGpu(info: Record<string, unknown>, refuse?: string): GPU {
  const adapter = {
    info,
    features: new Set<string>(),
    limits: {},
    requestDevice: () =>
      refuse === undefined
        ? Promise.resolve(lostOnDestroyDevice())
        : Promise.reject(new Error(refuse)),
  };
  return { requestAdapter: () => Promise.resolve(adapter) } as unknown as GPU;
}

/** A loader whose Dawn finds a hardware adapter (its device refused with `refuse`), Deno a device. */
function hardwareDawnLoader(refuse: string | undefined, loaded: string[] = []): RuntimeLoader {
  return (name, flags) => {
    loaded.push(name);
    return Promise.resolve(
      name === "deno"
        ? runtimeFromGpu(deviceGpu(LAVAPIPE), { name: "deno", version: "2" })
        : runtimeFromGpu(deviceGpu(HARDWARE, refuse), { name: "dawn", version: "0.6.2", flags }),
    );
  };
}

Deno.test("serve start-up: auto falls back to deno when Dawn's hardware adapter makes no device", async () => {
  const lines: string[] = [];
  const loaded: string[] = [];
  const { device, close } = await acquireDevice(
    true,
    { choice: "auto", dawnFlags: DEFAULT },
    undefined,
    {
      line: (t) => lines.push(t),
      fatal: (r) => assert.fail(`auto must not be fatal: ${r}`),
      load: hardwareDawnLoader("no device for you", loaded),
    },
  );
  try {
    const r = device.report();
    assert.equal(r.available, true, `served with no device: ${r.reason}`);
    assert.equal(r.runtime, "deno");
    assert.ok(device.current(), "Deno's runtime gave the device");
    const why = "Dawn found a hardware adapter, NVIDIA H200 (nvidia, hopper), but could not " +
      "create a device: requestDevice failed: no device for you";
    assert.equal(r.selection, `auto: not Dawn (${why})`);
    const dawn = r.other_runtimes?.dawn;
    assert.equal(dawn?.available, true, "Dawn loads and finds an adapter");
    assert.equal(dawn?.reason, why, "/v1/device says why Dawn was not chosen");
    assert.equal(dawn?.version, "0.6.2");
    assert.equal(dawn?.adapter?.description, "NVIDIA H200");
    assert.match(lines[0], /^webgpu: deno 2 .*; auto: not Dawn \(Dawn found a hardware adapter/);
    await new Promise((res) => setTimeout(res, 0)); // the background probe of the others
    assert.deepEqual(loaded, ["dawn", "deno"], "Dawn is not loaded again to be described");
  } finally {
    await close();
  }
});

Deno.test("serve start-up: auto keeps Dawn when its hardware adapter makes a device", async () => {
  const { device, close } = await acquireDevice(
    true,
    { choice: "auto", dawnFlags: DEFAULT },
    undefined,
    { line: () => {}, probeOthers: false, load: hardwareDawnLoader(undefined) },
  );
  try {
    const r = device.report();
    assert.equal(r.available, true);
    assert.equal(r.runtime, "dawn");
    assert.match(r.selection ?? "", /^auto: Dawn found a hardware adapter, NVIDIA H200/);
  } finally {
    await close();
  }
});

Deno.test("serve start-up: an explicit dawn whose device fails is fatal, not a fall-back", async () => {
  const fatal = await acquireDevice(
    true,
    { choice: "dawn", dawnFlags: DEFAULT },
    undefined,
    {
      line: () => {},
      probeOthers: false,
      load: hardwareDawnLoader("no device for you"),
      fatal: (r) => {
        throw new Error(r);
      },
    },
  ).then(() => "", (e) => (e as Error).message);
  assert.equal(
    fatal,
    "webgpu: --webgpu-runtime dawn cannot start: requestDevice failed: no device for you",
  );
});

Deno.test("runtime report: the runtime not chosen is probed once, lazily, without a device", async () => {
  const loaded: string[] = [];
  let devices = 0;
  const dawnGpu = {
    requestAdapter: () =>
      Promise.resolve({
        info: HARDWARE,
        features: new Set<string>(),
        limits: {},
        requestDevice: () => (devices++, Promise.reject(new Error("no device wanted"))),
      }),
  } as unknown as GPU;
  const s = await selectRuntime({ choice: "deno", dawnFlags: DEFAULT }, fakeLoader(dawnGpu));
  const mgr = new WebGpuDeviceManager({ selection: s, load: fakeLoader(dawnGpu, loaded) });
  assert.deepEqual(mgr.report().other_runtimes, {
    dawn: { available: false, reason: "not probed" },
  });
  assert.deepEqual(loaded, [], "nothing loads Dawn until asked");
  await Promise.all([mgr.probeOtherRuntimes(), mgr.probeOtherRuntimes()]);
  assert.deepEqual(loaded, ["dawn"]);
  assert.equal(devices, 0);
  const o = mgr.report().other_runtimes!.dawn;
  assert.equal(o.available, true);
  assert.equal(o.reason, "not chosen: requested deno");
  assert.equal(o.adapter?.vendor_name, "nvidia");
  assert.equal(o.adapter?.architecture, "hopper");
  const r = mgr.report();
  assert.equal(r.runtime, "deno");
  assert.equal(r.runtime_version, "2");
  assert.deepEqual(r.runtime_flags, []);
});

Deno.test("runtime helpers: Dawn's printed messages become one line each", () => {
  const printed = "Warning: Vulkan shaderUniform*ArrayDynamicIndexing required.\n" +
    " - While initializing adapter (backend=BackendType::Vulkan)\n" +
    "    at InitializeImpl (/home/runner/work/dawn/src/dawn/native/vulkan/PhysicalDeviceVk.cpp:257)\n\n" +
    "Warning: maxDynamicUniformBuffersPerPipelineLayout artificially reduced from 1000000 to 16\n";
  assert.deepEqual(dawnMessages(printed), [
    "Vulkan shaderUniform*ArrayDynamicIndexing required. - While initializing adapter (backend=BackendType::Vulkan)",
    "maxDynamicUniformBuffersPerPipelineLayout artificially reduced from 1000000 to 16",
  ]);
  assert.deepEqual(dawnMessages(""), []);
});

Deno.test("runtime helpers: backend API, vendor names, software adapters", () => {
  assert.deepEqual(dawnBackendApi(["backend=vk"]), { api: "vulkan", source: "Dawn flag backend=" });
  assert.equal(dawnBackendApi(["backend=gl", "backend=d3d"]).api, "d3d12");
  if (Deno.build.os === "linux" && !Deno.env.get("DAWNNODE_BACKEND")) {
    assert.equal(dawnBackendApi(DEFAULT).api, "vulkan");
  }
  assert.equal(vendorName("65541"), "mesa");
  assert.equal(vendorName("0x10de"), "nvidia");
  assert.equal(vendorName("4318"), "nvidia");
  assert.equal(vendorName("NVIDIA"), "nvidia");
  assert.equal(vendorName("12345"), undefined);
  assert.equal(vendorName(""), undefined);
  const base = { vendor: "", architecture: "", device: "", description: "" };
  assert.equal(
    isSoftwareAdapter({ ...base, description: "llvmpipe (LLVM 15.0.6, 256 bits)" }),
    true,
  );
  assert.equal(isSoftwareAdapter({ ...base, architecture: "software" }), true);
  assert.equal(isSoftwareAdapter({ ...base, is_fallback_adapter: true }), true);
  assert.equal(isSoftwareAdapter({ ...base, description: "SwiftShader Device" }), true);
  assert.equal(
    isSoftwareAdapter({ ...base, description: "NVIDIA H200", is_fallback_adapter: false }),
    false,
  );
});

Deno.test("runtime helpers: enable subgroups only where a module uses them", () => {
  const sg = "@compute @workgroup_size(8) fn main() { let x = subgroupAdd(1.0); }";
  assert.equal(enableSubgroups(sg), `enable subgroups; ${sg}`);
  const quad = "fn f(v: f32) -> f32 { return quadSwapX(v); }";
  assert.equal(enableSubgroups(quad), `enable subgroups; ${quad}`);
  const builtin = "fn main(@builtin(subgroup_invocation_id) i: u32) {}";
  assert.equal(enableSubgroups(builtin), `enable subgroups; ${builtin}`);
  const done = "enable f16, subgroups;\nfn f() { let x = subgroupMax(1.0); }";
  assert.equal(enableSubgroups(done), done);
  const plain = "// no subgroups here: subgroupless\nfn f() {}";
  assert.equal(enableSubgroups(plain), plain);
});

/** libc's write(2) on fd 2, as native code writes (Deno.stderr is the test runner's pipe). */
function nativeStderrWriter(): ((text: string) => void) & { close(): void } {
  const lib = Deno.dlopen(Deno.build.os === "darwin" ? "libSystem.B.dylib" : "libc.so.6", {
    write: { parameters: ["i32", "buffer", "usize"], result: "isize" },
  });
  const w = (text: string) => {
    const b = new TextEncoder().encode(text);
    lib.symbols.write(2, b, BigInt(b.length));
  };
  return Object.assign(w, { close: () => lib.close() });
}

Deno.test({
  name: "runtime helpers: captureStderr takes what native code writes on fd 2 during the call",
  ignore: Deno.build.os !== "linux" && Deno.build.os !== "darwin",
}, () => {
  const write = nativeStderrWriter();
  try {
    const c = captureStderr(() => (write("Warning: from native code\n"), 42));
    assert.equal(c.value, 42);
    assert.equal(c.captured, true);
    assert.equal(c.text, "Warning: from native code\n");
    assert.throws(() =>
      captureStderr(() => {
        throw new Error("inner");
      }), /inner/);
    // fd 2 is back in place after a throw: a new capture sees only its own text.
    assert.equal(captureStderr(() => write("x")).text, "x");
  } finally {
    write.close();
  }
});
