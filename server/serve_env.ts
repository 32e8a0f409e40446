/**
 * The environment variables of the GPU layer and the backends, checked once at start-up
 * (main.ts, after `--help`): a bad value is refused with one line naming the variable and its
 * value, exit 2 as a bad flag. Before, ATTN_DECODE_TUNING, ATTN_PREFILL_MMA_SHAPE and
 * ATTN_FLASH_TILE crashed the process as the backends loaded (`--help` and `--no-gpu` too), and
 * the others fell back to their defaults unsaid (the pools' caps warned at their first use).
 * The modules that read them are unchanged: the rules below are theirs, empty being unset
 * where they read it so, and the three parsed values go through the backends' own readers,
 * loaded only once the rest passed (the backends load the host pool, which reads its cap).
 * @module
 */
import { MAX_TIMER_MS } from "../core/timeout.ts";

/** A variable refused at start-up: main.ts prints the message alone (no usage) and exits 2. */
export class StartupEnvError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StartupEnvError";
  }
}

const isInt = (v: string) => /^\d+$/.test(v) && Number.isSafeInteger(Number(v));
const inRange = (min: number, max: number) => (v: string) =>
  isInt(v) && Number(v) >= min && Number(v) <= max;
const GPU_TIMINGS = ["sampled", "total", "calls", "off"];

/** Each variable's rule: what it must be, the test, and whether empty reads as unset. */
const RULES: Record<string, { must: string; ok: (v: string) => boolean; emptyUnset: boolean }> = {
  // gpu/kernel.ts kernelCacheLimit
  ATTN_KERNEL_CACHE_LIMIT: { must: "an integer >= 1", ok: inRange(1, Infinity), emptyUnset: true },
  // gpu/pipelines.ts compileTimeoutMs: a timer's length
  ATTN_COMPILE_TIMEOUT_MS: {
    must: `an integer from 1 to ${MAX_TIMER_MS} (ms)`,
    ok: inRange(1, MAX_TIMER_MS),
    emptyUnset: true,
  },
  // gpu/gpu_plan.ts GPU_TIMING
  ATTN_GPU_TIMING: {
    must: `one of ${GPU_TIMINGS.join(", ")}`,
    ok: (v) => GPU_TIMINGS.includes(v),
    emptyUnset: true,
  },
  // core/data.ts DEVICE_FINITE_CHECK_BYTES (which reads empty as 0)
  ATTN_DEVICE_FINITE_BYTES: { must: "an integer >= 0 (bytes)", ok: isInt, emptyUnset: false },
  // gpu/dawn_tick_pace.ts tickPaceFromEnv
  ATTN_DAWN_TICK_SPIN_MS: {
    must: "a number of ms >= 0, or off",
    ok: (v) => v === "off" || (/^\d+(\.\d+)?$/.test(v) && Number.isFinite(Number(v))),
    emptyUnset: true,
  },
  // gpu/buffer_pool.ts poolCapFromEnv (GPU_POOL_CAP_ENV, and host_pool.ts HOST_POOL_CAP_ENV)
  ATTN_GPU_POOL_MAX_FREE_BYTES: { must: "an integer >= 0 (bytes)", ok: isInt, emptyUnset: true },
  ATTN_HOST_POOL_MAX_FREE_BYTES: { must: "an integer >= 0 (bytes)", ok: isInt, emptyUnset: true },
  // server/device_threads.ts threadExitGrace (which reads empty as 0 and caps at 10 s)
  ATTN_THREAD_EXIT_GRACE_MS: {
    must: "an integer from 0 to 10000 (ms)",
    ok: inRange(0, 10_000),
    emptyUnset: false,
  },
  // backends/webgpu_flash.ts envOn: anything but 0 is on
  ATTN_PREFILL_MMA: {
    must: "0 (off) or 1 (on)",
    ok: (v) => v === "0" || v === "1",
    emptyUnset: true,
  },
  ATTN_PREFILL_SPLIT: {
    must: "0 (off) or 1 (on)",
    ok: (v) => v === "0" || v === "1",
    emptyUnset: true,
  },
};

/** The variables parsed by the backends' own readers (which throw on a bad value). */
const PARSED = ["ATTN_DECODE_TUNING", "ATTN_PREFILL_MMA_SHAPE", "ATTN_FLASH_TILE"];

/** Every variable {@link checkServeEnv} checks (serve_options.ts `serveEnv` reads them). */
export const CHECKED_ENV: readonly string[] = [...Object.keys(RULES), ...PARSED];

const message = (e: unknown) => e instanceof Error ? e.message : String(e);

/**
 * Checks the variables of {@link CHECKED_ENV} in `env` (the process's, in main.ts: the parsed
 * three are read from it by the backends' readers).
 * @throws StartupEnvError naming the first bad variable and its value.
 */
export async function checkServeEnv(env: Record<string, string | undefined>): Promise<void> {
  for (const [name, rule] of Object.entries(RULES)) {
    const v = env[name];
    if (v === undefined || (v === "" && rule.emptyUnset) || rule.ok(v)) continue;
    throw new StartupEnvError(`${name} must be ${rule.must}, got ${JSON.stringify(v)}`);
  }
  const tuning = env.ATTN_DECODE_TUNING;
  if (tuning) {
    const { envDecodeTuning } = await import("../backends/webgpu_decode_tuning.ts");
    try {
      const o = JSON.parse(tuning);
      if (o === null || typeof o !== "object" || Array.isArray(o)) throw new Error("not an object");
      envDecodeTuning();
    } catch (e) {
      throw new StartupEnvError(
        "ATTN_DECODE_TUNING must be a JSON object of DecodeTuning fields " +
          `(backends/webgpu_decode_tuning.ts), got ${JSON.stringify(tuning)}: ${
            message(e).replace(/^ATTN_DECODE_TUNING: /, "")
          }`,
      );
    }
  }
  if (env.ATTN_PREFILL_MMA_SHAPE) {
    const { envMmaShape } = await import("../backends/flash_mma_plan.ts");
    try {
      envMmaShape();
    } catch (e) {
      throw new StartupEnvError(message(e)); // names the variable, its value and the shapes
    }
  }
  const tile = env.ATTN_FLASH_TILE;
  if (tile) {
    const { envFlashTile } = await import("../backends/flash_plan.ts");
    try {
      envFlashTile();
    } catch (e) {
      throw new StartupEnvError(
        `ATTN_FLASH_TILE must be a tile TXxTYxRMxRN (e.g. 8x8x4x4), got ${JSON.stringify(tile)}: ${
          message(e)
        }`,
      );
    }
  }
}
