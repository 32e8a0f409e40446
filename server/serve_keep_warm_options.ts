/**
 * The serve keep-warm options: `--keep-warm-ms` (over ATTN_KEEP_WARM_MS) and the other
 * `--keep-warm-*` flags, checked into the {@link KeepWarmOptions} gpu/keep_warm.ts runs with.
 * @module
 */
import {
  checkKeepWarmOptions,
  KEEP_WARM_DEFAULTS,
  KEEP_WARM_MODES,
  type KeepWarmMode,
  type KeepWarmOptions,
} from "../gpu/keep_warm.ts";
import { EnvValueError } from "../core/env.ts";
import { KEEP_WARM_ENV, MAX_KEEP_WARM_MS } from "./serve_help.ts";
import { intFlag } from "./serve_flag_values.ts";

/** `--keep-warm-mode`. */
function keepWarmMode(v: string | undefined): KeepWarmMode {
  if (v === undefined) return KEEP_WARM_DEFAULTS.mode;
  const mode = KEEP_WARM_MODES.find((m) => m === v);
  if (!mode) {
    throw new Error(
      `--keep-warm-mode must be one of ${KEEP_WARM_MODES.join(", ")}, got ${JSON.stringify(v)}`,
    );
  }
  return mode;
}

/** `--keep-warm-*` (the hold also from the environment variable). */
export function keepWarmOptions(
  values: Record<string, string | boolean | string[] | undefined>,
  env: string | undefined,
): KeepWarmOptions {
  const flag = (k: string) => values[k] as string | undefined;
  const d = KEEP_WARM_DEFAULTS;
  const hold = flag("keep-warm-ms") ?? (env === "" ? undefined : env);
  if (hold !== undefined && (!/^\d+$/.test(hold) || Number(hold) > MAX_KEEP_WARM_MS)) {
    const fromEnv = flag("keep-warm-ms") === undefined;
    const name = fromEnv ? KEEP_WARM_ENV : "--keep-warm-ms";
    const msg = `${name} must be an integer from 0 to ${MAX_KEEP_WARM_MS}, got ` +
      JSON.stringify(hold);
    throw fromEnv ? new EnvValueError(name, hold, msg) : new Error(msg);
  }
  const o = {
    hold_ms: hold === undefined ? d.hold_ms : Number(hold),
    spin_iters: intFlag("keep-warm-spin-iters", flag("keep-warm-spin-iters"), d.spin_iters, 1),
    workgroups: intFlag("keep-warm-workgroups", flag("keep-warm-workgroups"), d.workgroups, 1),
    depth: intFlag("keep-warm-depth", flag("keep-warm-depth"), d.depth, 1),
    mode: keepWarmMode(flag("keep-warm-mode")),
    period_ms: intFlag("keep-warm-period-ms", flag("keep-warm-period-ms"), d.period_ms, 1),
  };
  return checkKeepWarmOptions(o);
}
