/**
 * Compute pipelines, compiled once per device and cached under a readable key such as
 * `decode[f16]:hd128:bs16:wg64`. Compilation runs inside validation and internal error
 * scopes; compiler messages (from `getCompilationInfo`) and scope errors become a
 * {@link ShaderCompileError}. A failed compilation is not cached, so a fixed kernel can be
 * retried. The driver's compile is bounded ({@link compileTimeoutMs}): on the H200 two pipelines
 * never finished compiling (bench/NOTES.md v0.6), and a call must not wait on one forever.
 * @module
 */
import { ShaderCompileError } from "../core/errors.ts";
import type { GpuContext } from "../core/types.ts";
import { envInt, type EnvSetting, envVar, readSetting, switchSetting } from "../core/env.ts";
import { MAX_TIMER_MS } from "../core/timeout.ts";
import { trace } from "../core/trace.ts";
import { inErrorScopes } from "./error_scopes.ts";

/** The error scopes a compile's calls run in (gpu/error_scopes.ts): innermost first. */
const SCOPES: readonly GPUErrorFilter[] = ["validation", "internal"];

interface Entry {
  code: string;
  entryPoint: string;
  pipeline: Promise<GPUComputePipeline>;
}

const caches = new WeakMap<GPUDevice, Map<string, Entry>>();

function cacheOf(device: GPUDevice): Map<string, Entry> {
  let m = caches.get(device);
  if (!m) {
    m = new Map();
    caches.set(device, m);
  }
  return m;
}

/** Formats one compilation message with its line and column. */
function formatMessage(m: GPUCompilationMessage): string {
  const where = m.lineNum ? ` at ${m.lineNum}:${m.linePos}` : "";
  return `${m.type}${where}: ${String(m.message).trim()}`;
}

/**
 * Compiles one pipeline (no caching: {@link getComputePipeline} and gpu/kernel.ts cache) with
 * `layout`: an explicit bind-group layout, or "auto".
 * @throws ShaderCompileError with the compiler's messages.
 */
export function compilePipeline(
  ctx: GpuContext,
  key: string,
  code: string,
  layout: GPUBindGroupLayout | "auto" = "auto",
  entryPoint = "main",
): Promise<GPUComputePipeline> {
  if (serialCompiles()) {
    // One compile at a time per device (ATTN_COMPILE_SERIAL=1): each waits for the one before.
    const before = serialTails.get(ctx.device) ?? Promise.resolve();
    const mine = before.then(() => compilePipelineNow(ctx, key, code, layout, entryPoint));
    serialTails.set(ctx.device, mine.then(() => {}, () => {}));
    return mine;
  }
  return compilePipelineNow(ctx, key, code, layout, entryPoint);
}

const serialTails = new WeakMap<GPUDevice, Promise<void>>();

/** `ATTN_COMPILE_SERIAL` (`0` or `1`, off when unset): compiles one at a time per device. */
export const COMPILE_SERIAL_SETTING: EnvSetting<boolean> = switchSetting(
  "ATTN_COMPILE_SERIAL",
  false,
);

/** `ATTN_COMPILE_LOG` (`0` or `1`, off when unset): each compile logged with its time (stderr). */
export const COMPILE_LOG_SETTING: EnvSetting<boolean> = switchSetting("ATTN_COMPILE_LOG", false);

/** Whether compiles run one at a time per device: `ATTN_COMPILE_SERIAL=1`. */
export function serialCompiles(): boolean {
  return readSetting(COMPILE_SERIAL_SETTING);
}

async function compilePipelineNow(
  ctx: GpuContext,
  key: string,
  code: string,
  layout: GPUBindGroupLayout | "auto",
  entryPoint: string,
): Promise<GPUComputePipeline> {
  const t0 = compileTrace(key, code);
  try {
    return await compileOnce(ctx, key, code, layout, entryPoint);
  } finally {
    if (t0 !== null) {
      console.error(`wgsl: compiled ${key} in ${(performance.now() - t0).toFixed(0)} ms`);
      trace(`wgsl: compiled ${key}`);
    }
  }
}

/**
 * Diagnostics of slow or hanging driver compiles (the H200's compiler took minutes on some
 * shaders, bench/NOTES.md): with `ATTN_WGSL_DUMP=DIR` each pipeline's source is written to
 * DIR before it compiles (so a hang leaves it behind), and that or `ATTN_COMPILE_LOG=1` logs
 * the start and the time of each compile to stderr. Returns the start time, or null when off.
 */
function compileTrace(key: string, code: string): number | null {
  const dir = envVar("ATTN_WGSL_DUMP");
  if (!dir && !readSetting(COMPILE_LOG_SETTING) && !envVar("ATTN_TRACE_FILE")) return null;
  if (dir) {
    const name = key.replace(/[^A-Za-z0-9._-]+/g, "_").slice(0, 180);
    try {
      Deno.mkdirSync(dir, { recursive: true });
      Deno.writeTextFileSync(`${dir}/${name}.wgsl`, `// ${key}\n${code}`);
    } catch (e) {
      console.error(`wgsl: cannot dump ${key}: ${e instanceof Error ? e.message : e}`);
    }
  }
  console.error(`wgsl: compiling ${key} (${code.length} chars)`);
  trace(`wgsl: compiling ${key}`);
  return performance.now();
}

async function compileOnce(
  ctx: GpuContext,
  key: string,
  code: string,
  layout: GPUBindGroupLayout | "auto",
  entryPoint: string,
): Promise<GPUComputePipeline> {
  const device = ctx.device;
  // One deadline for every wait of the compile: the compiler's messages, the pipeline and the
  // error scopes (on the H200 a compile stalled with the GPU idle; the stage it stalled in is
  // named in the error).
  const limit = compileTimeoutMs();
  const deadline = performance.now() + limit;
  const bounded = <T>(p: Promise<T>, stage: string) =>
    withTimeout(p, Math.max(1, deadline - performance.now()), stage, limit);
  const messages: string[] = [];
  const scopes: Promise<(GPUError | null)[]>[] = [];
  let pipeline: GPUComputePipeline | null = null;
  let timedOut = "";
  const made = inErrorScopes(
    device,
    SCOPES,
    () => device.createShaderModule({ label: key, code }),
  );
  scopes.push(made.errors);
  try {
    const info = await bounded(made.value.getCompilationInfo(), "compilation info");
    for (const m of info.messages) if (m.type === "error") messages.push(formatMessage(m));
  } catch (e) {
    if (e instanceof CompileTimeout) timedOut = e.message;
    // else getCompilationInfo unsupported: rely on the error scopes
  }
  if (messages.length === 0 && !timedOut) {
    try {
      const started = inErrorScopes(device, SCOPES, () =>
        device.createComputePipelineAsync({
          label: key,
          layout: layout === "auto"
            ? "auto"
            : device.createPipelineLayout({ label: key, bindGroupLayouts: [layout] }),
          compute: { module: made.value, entryPoint },
        }));
      scopes.push(started.errors);
      pipeline = await bounded(started.value, "pipeline");
    } catch (e) {
      if (e instanceof CompileTimeout) timedOut = e.message;
      else messages.push(`pipeline: ${e instanceof Error ? e.message.trim() : String(e)}`);
    }
  }
  if (!timedOut) {
    try {
      for (const errors of scopes) {
        for (const err of await bounded(errors, "validation error scope")) {
          const msg = err?.message?.trim();
          if (msg && !messages.some((m) => m.includes(msg.slice(0, 60)))) messages.push(msg);
        }
      }
    } catch (e) {
      // only a CompileTimeout can come from these waits (a pop never rejects)
      timedOut = e instanceof Error ? e.message : String(e);
    }
  }
  if (timedOut) throw new ShaderCompileError(key, [timedOut]);
  if (messages.length > 0 || !pipeline) {
    throw new ShaderCompileError(key, messages.length ? messages : ["unknown compile failure"]);
  }
  return pipeline;
}

/** Default bound on one driver compile (lavapipe took up to 6 minutes on tensor-core kernels). */
export const DEFAULT_COMPILE_TIMEOUT_MS = 600_000;

/** `ATTN_COMPILE_TIMEOUT_MS`: a timer's length, an integer from 1 to MAX_TIMER_MS ms. */
export const COMPILE_TIMEOUT_SETTING: EnvSetting<number> = {
  name: "ATTN_COMPILE_TIMEOUT_MS",
  unset: DEFAULT_COMPILE_TIMEOUT_MS,
  parse: (text) => envInt("ATTN_COMPILE_TIMEOUT_MS", text, 1, MAX_TIMER_MS, " (ms)"),
};

/**
 * The bound on one driver compile: `ATTN_COMPILE_TIMEOUT_MS`, else the default. Read as each
 * compile starts: a bad value fails the compile, before it began, with an EnvValueError naming
 * it (the server refuses it at start-up, server/serve_env.ts).
 */
export function compileTimeoutMs(): number {
  return readSetting(COMPILE_TIMEOUT_SETTING);
}

class CompileTimeout extends Error {}

/**
 * `p`, or a CompileTimeout after `ms` (the timer cleared either way); its message says the
 * compile's whole bound, `limitMs`.
 */
export async function withTimeout<T>(
  p: Promise<T>,
  ms: number,
  stage = "pipeline",
  limitMs = ms,
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new CompileTimeout(
            `the driver did not finish compiling it within ${limitMs} ms ` +
              `(waiting for its ${stage})`,
          ),
        ),
      ms,
    );
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The compute pipeline for `key` on `ctx`'s device, compiling `code` on first use.
 * Concurrent calls for one key share one compilation.
 * @throws ShaderCompileError with the compiler's messages; Error when `key` was already
 *   used for different code (a key must name its specialisation completely).
 */
export function getComputePipeline(
  ctx: GpuContext,
  key: string,
  code: string,
  entryPoint = "main",
): Promise<GPUComputePipeline> {
  const cache = cacheOf(ctx.device);
  const hit = cache.get(key);
  if (hit) {
    if (hit.code !== code || hit.entryPoint !== entryPoint) {
      return Promise.reject(
        new Error(`pipeline key ${key} reused for different WGSL: the key must name every variant`),
      );
    }
    return hit.pipeline;
  }
  const pipeline = compilePipeline(ctx, key, code, "auto", entryPoint);
  cache.set(key, { code, entryPoint, pipeline });
  pipeline.catch(() => {
    if (cache.get(key)?.pipeline === pipeline) cache.delete(key);
  });
  return pipeline;
}

/** The keys of the pipelines compiled (or compiling) on `ctx`'s device, sorted. */
export function cachedPipelineKeys(ctx: GpuContext): string[] {
  return [...cacheOf(ctx.device).keys()].sort();
}
