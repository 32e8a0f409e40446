/**
 * The environment variables a running service reads lazily (at a call's first use, not at
 * import), checked when an {@link AttentionService} is built: a library user with a bad value
 * gets an EnvValueError there, naming the variable and its value, instead of each client a 500
 * later. (The server checks them all at start-up: server/serve_env.ts; those read at import
 * throw when their module loads.)
 * @module
 */
import { type EnvSetting, readSetting } from "../core/env.ts";
import { DEVICE_FINITE_BYTES_SETTING } from "../core/data.ts";
import { HOST_POOL_CAP_SETTING } from "../gpu/host_pool.ts";
import { GPU_POOL_CAP_SETTING } from "../gpu/buffer_pool.ts";
import { GPU_TIMING_SETTING } from "../gpu/gpu_plan.ts";
import { KERNEL_CACHE_LIMIT_SETTING } from "../gpu/kernel.ts";
import {
  COMPILE_LOG_SETTING,
  COMPILE_SERIAL_SETTING,
  COMPILE_TIMEOUT_SETTING,
} from "../gpu/pipelines.ts";
import { DAWN_TICK_GAP_SETTING, DAWN_TICK_SPIN_SETTING } from "../gpu/dawn_tick_pace.ts";
import { DEFER_READ_SETTING, EARLY_READ_SETTING } from "../gpu/map_read.ts";
import { UPLOAD_STAGING_SETTING } from "../gpu/upload_staging.ts";

/**
 * The settings read after import, by a call or a scrape (the server checks them at start-up
 * first, with its own: server/serve_env.ts).
 */
export const SERVICE_LAZY_SETTINGS: readonly EnvSetting<unknown>[] = [
  DEVICE_FINITE_BYTES_SETTING,
  HOST_POOL_CAP_SETTING,
  GPU_POOL_CAP_SETTING,
  GPU_TIMING_SETTING,
  KERNEL_CACHE_LIMIT_SETTING,
  COMPILE_TIMEOUT_SETTING,
  COMPILE_SERIAL_SETTING,
  COMPILE_LOG_SETTING,
  DAWN_TICK_SPIN_SETTING,
  DAWN_TICK_GAP_SETTING,
  EARLY_READ_SETTING,
  DEFER_READ_SETTING,
  UPLOAD_STAGING_SETTING,
];

/**
 * Reads each lazily read setting now.
 * @throws EnvValueError naming the first variable whose value its rule refuses.
 */
export function checkServiceEnv(): void {
  for (const s of SERVICE_LAZY_SETTINGS) readSetting(s);
}
