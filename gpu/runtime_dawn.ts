/**
 * The "dawn" runtime: Chrome's WebGPU implementation from npm `webgpu` (a Node-API addon;
 * deno.json maps `webgpu` to `npm:webgpu@0.6.2`). Loaded by a dynamic import, so nothing
 * loads Dawn unless this runs; the addon needs `--allow-ffi`.
 *
 * `create(flags)` gives a `GPU`. When Dawn finds no adapter it resolves null and only prints
 * why on stderr; the adapter request runs under {@link captureStderr} so that text becomes
 * the reason. A missing package, a missing permission or bad flags become `unavailable`.
 * Its devices get `enable subgroups;` added where a module needs it (gpu/runtime_wgsl.ts).
 *
 * Behaviour seen with Deno 2.9.6 (Mesa 25.0 lavapipe, Debian trixie):
 * - While any Dawn promise is pending, dawn.node (its AsyncRunner) polls the instance from a
 *   `setImmediate` chain, so the JS thread spins until it settles (and the round trip is
 *   microseconds). Each tick makes a native function whose release costs Deno O(n) (n² in
 *   all): gpu/dawn_tick_pace.ts paces the loop after its first 2 ms.
 *   Nothing keeps the process alive once the promises settle; `device.lost` does not.
 * - Tint enforces WGSL rules naga does not: a const-expression that is NaN or infinite
 *   (`bitcast<f32>(0x7fc00000u)`) is a shader-creation error, and subgroup builtins need
 *   `enable subgroups;`.
 * - Teardown: destroying a device from an `unload` listener kills the process (SIGSEGV), and
 *   under `deno test` a test file that ends with a Dawn operation still in flight (a failed
 *   test's sibling pipeline compiles) aborts the process (SIGABRT) before the failures are
 *   printed (`deno test --reporter=tap` prints each failure as it happens); `deno run` exits
 *   cleanly in both cases. Destroy devices while the event loop runs.
 * @module
 */
import type { AdapterResult, WebGpuRuntime } from "./runtime.ts";
import { captureStderr } from "./runtime_stderr.ts";
import { requireEnables } from "./runtime_wgsl.ts";
import { envVar } from "../core/env.ts";
import { installDawnTickPacing, tickPaceFromEnv } from "./dawn_tick_pace.ts";

/** The package this runtime loads (also in deno.json `imports`). */
export const DAWN_PACKAGE = "npm:webgpu@0.6.2";

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

const BACKEND_ALIASES: Readonly<Record<string, string>> = {
  vk: "vulkan",
  d3d: "d3d12",
  gl: "opengl",
  gles: "opengles",
};

/**
 * The backend Dawn's node binding picks: the `backend=` flag, else `DAWNNODE_BACKEND`, else
 * the platform's (Vulkan on Linux, D3D12 on Windows, Metal on macOS); it only ever
 * enumerates adapters of that one backend.
 */
export function dawnBackendApi(flags: readonly string[]): { api: string; source: string } {
  const norm = (s: string) => BACKEND_ALIASES[s.toLowerCase()] ?? s.toLowerCase();
  const flag = [...flags].reverse().find((f) => f.startsWith("backend="));
  if (flag) return { api: norm(flag.slice("backend=".length)), source: "Dawn flag backend=" };
  const env = envVar("DAWNNODE_BACKEND");
  if (env) return { api: norm(env), source: "DAWNNODE_BACKEND" };
  const os = Deno.build.os;
  const api = os === "windows" ? "d3d12" : os === "darwin" ? "metal" : "vulkan";
  return { api, source: `Dawn's only backend on ${os} unless backend= is given` };
}

/**
 * Dawn's printed log as one entry per message ("Warning: X\n - While ...\n    at F (file:N)"
 * becomes "X - While ..."; the source locations of Dawn's build machine are dropped).
 */
export function dawnMessages(text: string): string[] {
  const out: string[] = [];
  for (const line of text.split("\n")) {
    if (line.trim() === "" || /^\s+at \S.*:\d+\)?$/.test(line)) continue;
    const head = /^(Warning|Error|Info|Debug): (.*)$/.exec(line);
    if (head || out.length === 0) out.push((head ? head[2] : line).trim());
    else out[out.length - 1] += ` ${line.trim()}`;
  }
  return out;
}

/** What this project uses of npm `webgpu`. */
export interface DawnModule {
  create(flags: string[]): GPU;
}

/**
 * The one way this project loads Dawn: imports npm `webgpu` and installs the poll pacer
 * (gpu/dawn_tick_pace.ts) before any of its promises can exist. Dawn's poll loop makes one
 * native function per tick; unpaced, a long wait (a compile, a long kernel) left ~400k of them
 * and freeing them stalled the JS thread for minutes (bench/NOTES.md "v0.7 Dawn stalls").
 * @throws what the import throws (the addon did not load); EnvValueError for a bad
 *   `ATTN_DAWN_TICK_SPIN_MS` or `ATTN_DAWN_TICK_GAP_MS`.
 */
export async function importDawn(): Promise<DawnModule> {
  const pace = tickPaceFromEnv(); // a bad setting throws before the addon loads
  const mod = (await import("webgpu")) as unknown as DawnModule;
  installDawnTickPacing(pace);
  return mod;
}

async function packageVersion(): Promise<string> {
  try {
    const pkg = await import("webgpu/package.json", { with: { type: "json" } });
    return String(pkg.default.version);
  } catch {
    return DAWN_PACKAGE.slice(DAWN_PACKAGE.lastIndexOf("@") + 1);
  }
}

/** Loads Dawn with `flags`; never throws (a failure is the runtime's `unavailable`). */
export async function loadDawnRuntime(flags: readonly string[]): Promise<WebGpuRuntime> {
  const be = dawnBackendApi(flags);
  const meta = {
    name: "dawn",
    flags: Object.freeze([...flags]),
    backend_api: be.api,
    backend_api_source: be.source,
  };
  let mod: DawnModule;
  try {
    mod = await importDawn();
  } catch (e) {
    return unavailableDawn(meta, `cannot load ${DAWN_PACKAGE}: ${message(e)}`);
  }
  const version = await packageVersion();
  let gpu: GPU;
  try {
    gpu = mod.create([...flags]);
  } catch (e) {
    return unavailableDawn(
      { ...meta, version },
      `Dawn's create(${JSON.stringify(flags)}) failed: ${message(e)}`,
    );
  }
  // Dawn prints why an adapter failed only the first time its instance looks (it keeps the
  // failed adapter list): later empty requests reuse what it said then.
  let said: string[] = [];
  return {
    ...meta,
    version,
    async requestAdapter(o) {
      const r = await requestDawnAdapter(gpu, o, said);
      if (!r.adapter && r.warnings?.length) said = r.warnings;
      return r;
    },
    prepareDevice: requireEnables,
  };
}

async function requestDawnAdapter(
  gpu: GPU,
  options: GPURequestAdapterOptions | undefined,
  saidBefore: string[],
): Promise<AdapterResult> {
  let cap;
  try {
    cap = captureStderr(() => gpu.requestAdapter(options));
  } catch (e) {
    return { adapter: null, reason: `Dawn's requestAdapter failed: ${message(e)}` };
  }
  const warnings = dawnMessages(cap.text);
  try {
    const adapter = await cap.value;
    if (adapter) return { adapter, ...(warnings.length ? { warnings } : {}) };
  } catch (e) {
    return { adapter: null, warnings, reason: `Dawn's requestAdapter failed: ${message(e)}` };
  }
  const why = warnings.length ? warnings : saidBefore;
  const said = why.length
    ? why.join("; ")
    : cap.captured
    ? "it printed no reason"
    : "its reason, if any, went to stderr";
  return { adapter: null, warnings: why, reason: `Dawn found no adapter: ${said}` };
}

function unavailableDawn(
  meta: Omit<WebGpuRuntime, "requestAdapter" | "version"> & { version?: string },
  reason: string,
): WebGpuRuntime {
  return {
    ...meta,
    version: meta.version ?? DAWN_PACKAGE.slice(DAWN_PACKAGE.lastIndexOf("@") + 1),
    unavailable: reason,
    requestAdapter: () => Promise.resolve({ adapter: null, reason }),
  };
}
