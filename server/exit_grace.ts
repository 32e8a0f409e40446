/**
 * `ATTN_THREAD_EXIT_GRACE_MS`: how long server/device_threads.ts waits after terminating its
 * threads before the process may exit (see `threadExitGrace` there): an integer from 0 to
 * 10000 ms, default 300. Its rule lives here, a module of its own, for device_threads.ts (which
 * reads the variable) and server/serve_env.ts (which checks it at start-up) to share.
 * @module
 */
import { envInt, type EnvSetting, readSetting } from "../core/env.ts";

/** The longest grace, ms. */
export const MAX_THREAD_EXIT_GRACE_MS = 10_000;

/** The variable's rule. */
export const THREAD_EXIT_GRACE_SETTING: EnvSetting<number> = {
  name: "ATTN_THREAD_EXIT_GRACE_MS",
  unset: 300,
  parse: (text) => envInt("ATTN_THREAD_EXIT_GRACE_MS", text, 0, MAX_THREAD_EXIT_GRACE_MS, " (ms)"),
};

/**
 * The grace, read now.
 * @throws EnvValueError naming the variable and its value where the rule refuses it.
 */
export function threadExitGraceMs(): number {
  return readSetting(THREAD_EXIT_GRACE_SETTING);
}
