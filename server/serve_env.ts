/**
 * The environment variables of the GPU layer and the backends, checked once at start-up
 * (main.ts, after `--help`): a bad value is refused with one line naming the variable and its
 * value, exit 2 as a bad flag, where it would otherwise fail the first call that reads it (or,
 * for the registered backend's, the loading of the backends).
 *
 * No rule is stated here: each variable's rule is the {@link EnvSetting} of the module that
 * reads it (core/env.ts), and the check is that setting's own parse, so the start-up check and
 * the reader cannot disagree. The modules are loaded here (none reads a variable as it loads;
 * the registered WEBGPU_FLASH, which does, is not among them: its switches' rules live in
 * backends/flash_switches.ts).
 * @module
 */
import { type EnvSetting, EnvValueError, settingValue } from "../core/env.ts";

/** A variable refused at start-up: main.ts prints the message alone (no usage) and exits 2. */
export class StartupEnvError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "StartupEnvError";
  }
}

/**
 * Every variable {@link checkServeEnv} checks, in its order (serve_options.ts `serveEnv` reads
 * them): the names of {@link checkedSettings}' settings (a test holds the two equal).
 */
export const CHECKED_ENV: readonly string[] = [
  "ATTN_DEVICE_FINITE_BYTES",
  "ATTN_HOST_POOL_MAX_FREE_BYTES",
  "ATTN_GPU_POOL_MAX_FREE_BYTES",
  "ATTN_GPU_TIMING",
  "ATTN_KERNEL_CACHE_LIMIT",
  "ATTN_COMPILE_TIMEOUT_MS",
  "ATTN_COMPILE_SERIAL",
  "ATTN_COMPILE_LOG",
  "ATTN_DAWN_TICK_SPIN_MS",
  "ATTN_DAWN_TICK_GAP_MS",
  "ATTN_EARLY_READ",
  "ATTN_DEFER_READ",
  "ATTN_UPLOAD_STAGING",
  "ATTN_THREAD_EXIT_GRACE_MS",
  "ATTN_THREAD_PING_MS",
  "ATTN_THREAD_LOST_MS",
  "ATTN_THREAD_STUCK_MS",
  "ATTN_PREFILL_MMA",
  "ATTN_PREFILL_SPLIT",
  "ATTN_DECODE_TUNING",
  "ATTN_PREFILL_MMA_SHAPE",
  "ATTN_FLASH_TILE",
  "ATTN_HTTP_IDLE_TIMEOUT_MS",
  "ATTN_HTTP_HEAD_TIMEOUT_MS",
  "ATTN_HTTP_MAX_CONNECTIONS",
];

/**
 * The settings of {@link CHECKED_ENV}, in its order, from the modules that read them: those a
 * library service checks when built (service/service_env.ts), then the server's and the
 * backends'.
 */
export async function checkedSettings(): Promise<EnvSetting<unknown>[]> {
  const [service, grace, watchdog, flash] = await Promise.all([
    import("../service/service_env.ts"),
    import("./exit_grace.ts"),
    import("./thread_watchdog.ts"),
    import("../backends/flash_switches.ts"),
  ]);
  const [tuning, mma, tile, http1] = await Promise.all([
    import("../backends/webgpu_decode_tuning.ts"),
    import("../backends/flash_mma_plan.ts"),
    import("../backends/flash_plan.ts"),
    import("./http1_server.ts"),
  ]);
  return [
    ...service.SERVICE_LAZY_SETTINGS,
    grace.THREAD_EXIT_GRACE_SETTING,
    watchdog.THREAD_PING_SETTING,
    watchdog.THREAD_LOST_SETTING,
    watchdog.THREAD_STUCK_SETTING,
    flash.PREFILL_MMA_SETTING,
    flash.PREFILL_SPLIT_SETTING,
    tuning.DECODE_TUNING_SETTING,
    mma.MMA_SHAPE_SETTING,
    tile.FLASH_TILE_SETTING,
    http1.IDLE_TIMEOUT_SETTING,
    http1.HEAD_TIMEOUT_SETTING,
    http1.MAX_CONNECTIONS_SETTING,
  ];
}

/**
 * Checks the variables of {@link CHECKED_ENV} in `env` (the process's, in main.ts): each by
 * the rule of the module that reads it.
 * @throws StartupEnvError naming the first bad variable and its value (the reader's message).
 */
export async function checkServeEnv(env: Record<string, string | undefined>): Promise<void> {
  for (const s of await checkedSettings()) {
    try {
      settingValue(s, env[s.name]);
    } catch (e) {
      if (!(e instanceof EnvValueError)) throw e;
      throw new StartupEnvError(e.message, { cause: e });
    }
  }
}
