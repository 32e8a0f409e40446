/**
 * The server's device at start-up: no device with `--no-gpu`, else the selected WebGPU runtime
 * (`--webgpu-runtime deno|dawn|auto`) and its device, with one start-up line naming runtime,
 * version, backend API and adapter; an explicit `dawn` that cannot start exits 2 with Dawn's
 * own reason, and an `auto` whose Dawn found a hardware adapter but made no device serves on
 * Deno's runtime (gpu/device.ts acquireSelected), `/v1/device` saying why not Dawn. The runtime
 * not chosen is probed once in the background (no device) so `/v1/device` can say why it was
 * not used. With `--keep-warm-ms N` the provider is wrapped in
 * gpu/keep_warm.ts's KeepWarmProvider (one start-up line says whether it is on, or why not).
 * @module
 */
import { type ErrorLogger, problemCodeOf } from "./problem.ts";
import type { DeviceProvider } from "../core/types.ts";
import { builtinBackends } from "../backends/index.ts";
import { AttentionService } from "../service/service.ts";
import type { CallLimits } from "../service/validate.ts";
import type { AccessPolicy } from "./auth.ts";
import { createHandler, type Handler } from "./handler.ts";
import { SCRAPE_HEADER, TENTATIVE_HEADER } from "./metrics_merge.ts";
import { acquireSelected, NoDeviceProvider } from "../gpu/device.ts";
import type { RuntimeLoader } from "../gpu/runtime.ts";
import type { RuntimeOptions } from "../gpu/runtime_options.ts";
import { deviceSummary, otherRuntimesSummary } from "../gpu/runtime_report.ts";
import { type KeepWarmOptions, KeepWarmProvider } from "../gpu/keep_warm.ts";

/** Where {@link acquireDevice} says what it did, and what ends a start that cannot go on. */
export interface DeviceSetupHooks {
  /** One start-up line (default: stderr). */
  line?: (text: string) => void;
  /** An explicit `dawn` that cannot start (default: the line, then exit 2). */
  fatal?: (reason: string) => never;
  /** Probe the runtime not chosen for /v1/device (default true; device threads past the first
   * skip it, so Dawn is not loaded in every thread only to be described). */
  probeOthers?: boolean;
  /** Loads the runtimes (default gpu/runtime.ts loadRuntime; tests give fakes). */
  load?: RuntimeLoader;
}

const exit2 = (reason: string): never => {
  console.error(reason);
  Deno.exit(2);
};

/** The device provider and how to release it at shutdown. */
export async function acquireDevice(
  gpu: boolean,
  runtime: RuntimeOptions,
  keepWarm?: KeepWarmOptions,
  hooks: DeviceSetupHooks = {},
): Promise<{ device: DeviceProvider; close: () => void }> {
  const say = hooks.line ?? ((t: string) => console.error(t));
  if (!gpu) {
    say("webgpu: disabled (--no-gpu)");
    return { device: new NoDeviceProvider(), close: () => {} };
  }
  const { manager: mgr, ctx } = await acquireSelected(runtime, hooks.load);
  if (!ctx && runtime.choice === "dawn") {
    (hooks.fatal ?? exit2)(`webgpu: --webgpu-runtime dawn cannot start: ${mgr.report().reason}`);
  }
  say(`webgpu: ${deviceSummary(mgr.report())}`);
  if (hooks.probeOthers ?? true) {
    mgr.probeOtherRuntimes().then(() => {
      for (const line of otherRuntimesSummary(mgr.report())) say(`webgpu: ${line}`);
    });
  }
  if (!keepWarm || keepWarm.hold_ms === 0) return { device: mgr, close: () => mgr.close() };
  const warm = new KeepWarmProvider(mgr, keepWarm, { dawn_flags: runtime.dawnFlags });
  const st = await warm.start();
  const o = st.options;
  say(
    st.enabled
      ? `keep-warm: on: hold ${o.hold_ms} ms, spins of ${o.spin_iters} iterations x ` +
        `${o.workgroups} workgroups, depth ${o.depth}, mode ${o.mode}` +
        (o.mode !== "await" ? ` every ${o.period_ms} ms (spin ${st.spin_ms?.toFixed(3)} ms)` : "") +
        (o.mode === "process"
          ? ` in a process of its own on ${st.process_adapter}`
          : ` (completion round trip ${st.round_trip_ms?.toFixed(3)} ms)`)
      : `keep-warm: off: ${st.reason}`,
  );
  return { device: warm, close: () => warm.close().finally(() => mgr.close()) };
}

/** What a service and its handler are built with (structured-cloneable: device threads get it). */
export interface ServingOptions {
  memoryBudgetBytes: number;
  limits: CallLimits;
  maxBodyBytes: number;
  maxJsonBodyBytes: number;
  access: AccessPolicy;
  instance?: string;
  /** A secret the device threads' front sends in `SCRAPE_HEADER` on the scrapes it merges. */
  scrapeToken?: string;
}

/**
 * The service over `device` and the pure handler over it (main.ts, device_thread.ts); `log`
 * takes its error lines (a device thread's are prefixed with its index).
 */
export function serviceAndHandler(
  device: DeviceProvider,
  o: ServingOptions,
  log?: ErrorLogger,
): { service: AttentionService; handler: Handler } {
  const service = new AttentionService({
    backends: builtinBackends(),
    device,
    memoryBudgetBytes: o.memoryBudgetBytes,
    limits: o.limits,
  });
  // The device threads' front asking for this thread's series (with its token), or none.
  const fromFront = o.scrapeToken === undefined
    ? undefined
    : (req: Request) => req.headers.get(SCRAPE_HEADER) === o.scrapeToken;
  const handler = createHandler(service, {
    maxBodyBytes: o.maxBodyBytes,
    maxJsonBodyBytes: o.maxJsonBodyBytes,
    access: o.access,
    instance: o.instance,
    log,
    notInFlight: fromFront,
    uncounted: fromFront &&
      ((req, res) =>
        fromFront(req) ||
        (req.headers.get(TENTATIVE_HEADER) === o.scrapeToken &&
          problemCodeOf(res) === "memory_budget_exceeded")),
  });
  return { service, handler };
}
