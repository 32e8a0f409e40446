/**
 * The entry point: `deno task serve [--port N] [--host H] [--max-body-bytes B]
 * [--memory-budget-bytes B] [--no-gpu] [--webgpu-runtime deno|dawn|auto] [--dawn-flags L]
 * [--dawn-flag K=V]`. Selects the WebGPU runtime and acquires the device (unless --no-gpu),
 * builds the service and serves it. The only module that calls Deno.serve.
 * @module
 */
import { parseArgs } from "node:util";
import { builtinBackends } from "../backends/index.ts";
import type { DeviceProvider } from "../core/types.ts";
import { NoDeviceProvider, WebGpuDeviceManager } from "../gpu/device.ts";
import { selectRuntime } from "../gpu/runtime.ts";
import {
  resolveRuntimeOptions,
  RUNTIME_HELP,
  runtimeEnv,
  type RuntimeOptions,
} from "../gpu/runtime_options.ts";
import { deviceSummary, otherRuntimesSummary } from "../gpu/runtime_report.ts";
import { AttentionService } from "../service/service.ts";
import { DEFAULT_MAX_BODY_BYTES } from "./body.ts";
import { createHandler } from "./handler.ts";

/** Default memory budget for server-held caches: 4 GiB. */
export const DEFAULT_MEMORY_BUDGET_BYTES = 4 * 1024 ** 3;

const HELP = `attention service: batched paged attention over HTTP

usage: deno task serve [options]

  --port N                  port to listen on (default 8000; 0 = any free port)
  --host H                  address to bind (default 127.0.0.1)
  --max-body-bytes B        largest request body in bytes (default ${DEFAULT_MAX_BODY_BYTES} = 512 MiB)
  --memory-budget-bytes B   total bytes of server-held KV caches (default ${DEFAULT_MEMORY_BUDGET_BYTES} = 4 GiB)
  --no-gpu                  do not acquire a WebGPU device (host backends only)
${RUNTIME_HELP}
  -h, --help                show this help
`;

function intFlag(name: string, v: string | undefined, dflt: number, min: number): number {
  if (v === undefined) return dflt;
  if (!/^\d+$/.test(v) || Number(v) < min || !Number.isSafeInteger(Number(v))) {
    throw new Error(`--${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`);
  }
  return Number(v);
}

/** Parsed command-line options. */
export interface ServeOptions {
  port: number;
  host: string;
  maxBodyBytes: number;
  memoryBudgetBytes: number;
  gpu: boolean;
  /** The WebGPU runtime and Dawn's flags (command line over environment). */
  runtime: RuntimeOptions;
  help: boolean;
}

/**
 * Parses the command line; `env` supplies ATTN_WEBGPU_RUNTIME / ATTN_DAWN_FLAGS.
 * @throws Error with a usage message on bad flags.
 */
export function parseServeArgs(
  args: string[],
  env: Record<string, string | undefined> = {},
): ServeOptions {
  const { values } = parseArgs({
    args,
    options: {
      port: { type: "string" },
      host: { type: "string" },
      "max-body-bytes": { type: "string" },
      "memory-budget-bytes": { type: "string" },
      "no-gpu": { type: "boolean" },
      "webgpu-runtime": { type: "string" },
      "dawn-flags": { type: "string" },
      "dawn-flag": { type: "string", multiple: true },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
    allowPositionals: false,
  });
  const port = intFlag("port", values.port, 8000, 0);
  if (port > 65535) throw new Error(`--port must be <= 65535, got ${port}`);
  return {
    port,
    host: values.host ?? "127.0.0.1",
    maxBodyBytes: intFlag("max-body-bytes", values["max-body-bytes"], DEFAULT_MAX_BODY_BYTES, 1),
    memoryBudgetBytes: intFlag(
      "memory-budget-bytes",
      values["memory-budget-bytes"],
      DEFAULT_MEMORY_BUDGET_BYTES,
      0,
    ),
    gpu: !values["no-gpu"],
    runtime: resolveRuntimeOptions({
      runtime: values["webgpu-runtime"],
      dawnFlags: values["dawn-flags"],
      dawnFlag: values["dawn-flag"],
    }, env),
    help: values.help ?? false,
  };
}

async function main(): Promise<void> {
  let o: ServeOptions;
  try {
    o = parseServeArgs(Deno.args, runtimeEnv());
  } catch (e) {
    console.error(`${e instanceof Error ? e.message : e}\n\n${HELP}`);
    Deno.exit(2);
  }
  if (o.help) {
    console.log(HELP);
    return;
  }
  let device: DeviceProvider;
  let mgr: WebGpuDeviceManager | null = null;
  if (o.gpu) {
    mgr = new WebGpuDeviceManager({ selection: await selectRuntime(o.runtime) });
    const ctx = await mgr.acquire();
    if (!ctx && o.runtime.choice === "dawn") {
      console.error(`webgpu: --webgpu-runtime dawn cannot start: ${mgr.report().reason}`);
      Deno.exit(2);
    }
    console.error(`webgpu: ${deviceSummary(mgr.report())}`);
    device = mgr;
    // Once, in the background: whether the runtime not chosen could start here (no device).
    const m = mgr;
    m.probeOtherRuntimes().then(() => {
      for (const line of otherRuntimesSummary(m.report())) console.error(`webgpu: ${line}`);
    });
  } else {
    device = new NoDeviceProvider();
    console.error("webgpu: disabled (--no-gpu)");
  }
  const service = new AttentionService({
    backends: builtinBackends(),
    device,
    memoryBudgetBytes: o.memoryBudgetBytes,
  });
  const handler = createHandler(service, { maxBodyBytes: o.maxBodyBytes });
  const server = Deno.serve({
    port: o.port,
    hostname: o.host,
    onListen: ({ hostname, port }) => {
      const h = hostname.includes(":") ? `[${hostname}]` : hostname;
      console.log(`listening on http://${h}:${port}`);
    },
  }, handler);
  const stop = () => {
    server.shutdown().then(() => service.close()).then(() => mgr?.close());
  };
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    try {
      Deno.addSignalListener(sig, stop);
    } catch { /* signal not supported here */ }
  }
  await server.finished;
}

if (import.meta.main) await main();
