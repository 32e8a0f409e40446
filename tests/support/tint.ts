/**
 * Tint, Dawn's WGSL compiler, on any machine: Dawn's `null` backend (npm `webgpu`,
 * `create(["backend=null"])`) gives a device that validates and compiles shaders without a GPU,
 * with `allow_unsafe_apis` also the subgroup-matrix feature the tensor-core kernel needs. Deno's
 * own runtime (naga) checks less, and Dawn finds no hardware adapter on the CPU machines.
 * @module
 */
import { loadDawnRuntime } from "../../gpu/runtime_dawn.ts";
import type { WebGpuRuntime } from "../../gpu/runtime.ts";
import { inErrorScopes } from "../../gpu/error_scopes.ts";

/**
 * A null-backend device and the Dawn runtime that made it: the runtime holds Dawn's `GPU`
 * object, which must stay referenced while the device lives (collected, it took the process
 * down: "std::system_error: Owner died", as gpu/flash_mma_device.ts says).
 */
export interface NullDawn {
  runtime: WebGpuRuntime;
  device: GPUDevice;
}

/** Features a test may ask of the null device; those the adapter lacks are left out. */
const WANTED = ["subgroups", "shader-f16", "chromium-experimental-subgroup-matrix"];

/** Dawn on its null backend, or why there is none (Dawn's own words). */
export async function nullDawn(): Promise<NullDawn | string> {
  const runtime = await loadDawnRuntime([
    "backend=null",
    "enable-dawn-features=allow_unsafe_apis",
  ]);
  if (runtime.unavailable) return runtime.unavailable;
  const { adapter, reason } = await runtime.requestAdapter();
  if (!adapter) return reason ?? "Dawn's null backend offers no adapter";
  const has = new Set<string>(adapter.features);
  const want = WANTED.filter((f) => has.has(f)) as GPUFeatureName[];
  return { runtime, device: await adapter.requestDevice({ requiredFeatures: want }) };
}

/** Tint's errors for `code` on `dawn`'s device, one line each. */
export async function tintErrors(dawn: NullDawn, code: string): Promise<string[]> {
  // An invalid module is also a validation error of the device. Left uncaptured, Dawn printed
  // it while the process exited ("validation: Error while parsing WGSL ..."), and each of the
  // CI passes whose exit aborted with glibc's "corrupted size vs. prev_size in fastbins" (4 of
  // 17) did so right after that print. The scope takes it here.
  const dev = dawn.device;
  const { value: m, errors } = inErrorScopes(
    dev,
    ["validation"],
    () => dev.createShaderModule({ code }),
  );
  const info = await m.getCompilationInfo();
  await errors;
  return info.messages.filter((x) => x.type === "error").map((x) =>
    `${x.lineNum}:${x.linePos} ${x.message.split("\n")[0]}`
  );
}
