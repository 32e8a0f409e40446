/**
 * Which WebGPU runtime to use and with which Dawn flags, from the command line and the
 * environment. Pure: callers pass the environment in.
 *
 * - The runtime: `--webgpu-runtime deno|dawn|auto` (serve) or `--runtime` (bench), else
 *   `ATTN_WEBGPU_RUNTIME`, else `deno`.
 * - Dawn's flags (`create(flags)` of npm `webgpu`): `--dawn-flags LIST`, else `ATTN_DAWN_FLAGS`,
 *   else {@link DEFAULT_DAWN_FLAGS}, replaces the whole list (`""`: no flags); then each
 *   `--dawn-flag KEY=VALUE` (repeatable) sets one key on top of it.
 *
 * A list is comma-separated, and a piece without `=` continues the previous flag's value, so
 * `enable-dawn-features=a,b,backend=vulkan` is the two flags `enable-dawn-features=a,b` and
 * `backend=vulkan` (Dawn's flags are all `key=value`; its toggle names hold no `=`).
 * @module
 */
import { envVar, parseVariable } from "../core/env.ts";

/** The runtimes: Deno's own `navigator.gpu`, and Dawn from npm `webgpu`. */
export const RUNTIME_NAMES = ["deno", "dawn"] as const;
/** A runtime's name. */
export type RuntimeName = (typeof RUNTIME_NAMES)[number];
/** What may be asked for: a runtime, or `auto` (Dawn on a hardware adapter, else Deno's). */
export const RUNTIME_CHOICES = ["deno", "dawn", "auto"] as const;
/** A runtime choice. */
export type RuntimeChoice = (typeof RUNTIME_CHOICES)[number];

/** Environment variable naming the runtime (`deno`, `dawn` or `auto`). */
export const RUNTIME_ENV = "ATTN_WEBGPU_RUNTIME";
/** Environment variable holding Dawn's flag list (replaces the defaults). */
export const DAWN_FLAGS_ENV = "ATTN_DAWN_FLAGS";

/**
 * Dawn's default flags: unsafe APIs (the experimental subgroup-matrix feature needs them), f16
 * on NVIDIA's Vulkan driver, no robustness transform, and timestamps at full resolution (Dawn
 * rounds them to 65.5 us by default, a browser's defence against timing attacks: every
 * sub-0.1 ms pass then read as 0 or 0.0655 ms on the H200).
 *
 * Robustness (Tint clamping every buffer index and guarding every subgroup-matrix call) is a
 * browser's defence against hostile shaders; this service runs only its own kernels, whose
 * indices come from validated batches. On the H200 it cost the tensor-core prefill kernel a
 * quarter of its time and decode ~9% (bench/NOTES.md v0.10, v0.11). {@link SAFE_DAWN_FLAGS}
 * keeps it (`--dawn-flags` with that list).
 */
export const DEFAULT_DAWN_FLAGS: readonly string[] = Object.freeze([
  "enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia,disable_robustness",
  "disable-dawn-features=timestamp_quantization",
]);

/** The default flags with Dawn's robustness transform kept (index clamps, guarded matrix calls). */
export const SAFE_DAWN_FLAGS: readonly string[] = Object.freeze([
  "enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia",
  "disable-dawn-features=timestamp_quantization",
]);

/** The resolved choice. */
export interface RuntimeOptions {
  choice: RuntimeChoice;
  /** Dawn's flags (used when Dawn is chosen or probed). */
  dawnFlags: string[];
}

/** The raw values from a command line (undefined: not given). */
export interface RuntimeArgs {
  runtime?: string;
  /** `--dawn-flag` values, each `KEY=VALUE`. */
  dawnFlag?: string[];
  /** `--dawn-flags` value, a list. */
  dawnFlags?: string;
}

/** Parses a runtime choice. @throws Error naming `source` and the value. */
export function parseRuntimeChoice(value: string, source: string): RuntimeChoice {
  const v = value.trim().toLowerCase();
  if ((RUNTIME_CHOICES as readonly string[]).includes(v)) return v as RuntimeChoice;
  throw new Error(
    `${source} must be one of ${RUNTIME_CHOICES.join(", ")}, got ${JSON.stringify(value)}`,
  );
}

/** Checks one Dawn flag is `KEY=VALUE` with a non-empty key. @throws Error naming `source`. */
export function checkDawnFlag(flag: string, source: string): string {
  const f = flag.trim();
  const eq = f.indexOf("=");
  if (eq <= 0) {
    throw new Error(`${source}: a Dawn flag is KEY=VALUE, got ${JSON.stringify(flag)}`);
  }
  return f;
}

/** Splits a flag list (see the module doc). @throws Error on a piece that is not a flag. */
export function splitDawnFlags(list: string, source: string): string[] {
  const out: string[] = [];
  for (const raw of list.split(",")) {
    const piece = raw.trim();
    if (piece === "") continue;
    if (!piece.includes("=") && out.length > 0) out[out.length - 1] += `,${piece}`;
    else out.push(checkDawnFlag(piece, source));
  }
  return out;
}

/** The key of a `KEY=VALUE` flag. */
export function dawnFlagKey(flag: string): string {
  return flag.slice(0, flag.indexOf("="));
}

/** Dawn's flags whose value is a comma list of toggles: `--dawn-flag` adds to them. */
export const DAWN_TOGGLE_LIST_KEYS = ["enable-dawn-features", "disable-dawn-features"];

/**
 * `base` with each of `extra` appended, or merged into the flag of the same key: a toggle list
 * ({@link DAWN_TOGGLE_LIST_KEYS}) gains the toggles it lacks (so `--dawn-flag
 * enable-dawn-features=x` keeps the defaults and adds x); any other flag is replaced.
 */
export function mergeDawnFlags(base: readonly string[], extra: readonly string[]): string[] {
  const out = [...base];
  const value = (f: string) => f.slice(f.indexOf("=") + 1);
  for (const f of extra) {
    const key = dawnFlagKey(f);
    const i = out.findIndex((b) => dawnFlagKey(b) === key);
    if (i < 0) out.push(f);
    else if (!DAWN_TOGGLE_LIST_KEYS.includes(key)) out[i] = f;
    else {
      const have = value(out[i]).split(",").filter((t) => t !== "");
      const add = value(f).split(",").filter((t) => t !== "" && !have.includes(t));
      out[i] = `${key}=${[...have, ...add].join(",")}`;
    }
  }
  return out;
}

/**
 * Resolves the choice and Dawn's flags; the command line wins over the environment.
 * @param runtimeFlag how the command line spells the runtime option, for messages.
 * @throws Error naming the option and its value; EnvValueError for a variable's (a server
 * prints its message without the usage: no flag was wrong).
 */
export function resolveRuntimeOptions(
  args: RuntimeArgs,
  env: Record<string, string | undefined>,
  runtimeFlag = "--webgpu-runtime",
): RuntimeOptions {
  const fromEnv = env[RUNTIME_ENV];
  const choice = args.runtime !== undefined
    ? parseRuntimeChoice(args.runtime, runtimeFlag)
    : fromEnv !== undefined && fromEnv !== ""
    ? parseVariable(RUNTIME_ENV, fromEnv, () => parseRuntimeChoice(fromEnv, RUNTIME_ENV))
    : "deno";
  const base = args.dawnFlags !== undefined
    ? splitDawnFlags(args.dawnFlags, "--dawn-flags")
    : env[DAWN_FLAGS_ENV] !== undefined
    ? parseVariable(
      DAWN_FLAGS_ENV,
      env[DAWN_FLAGS_ENV]!,
      () => splitDawnFlags(env[DAWN_FLAGS_ENV]!, DAWN_FLAGS_ENV),
    )
    : [...DEFAULT_DAWN_FLAGS];
  const extra = (args.dawnFlag ?? []).map((f) => checkDawnFlag(f, "--dawn-flag"));
  return { choice, dawnFlags: mergeDawnFlags(base, extra) };
}

/** Reads the variables {@link resolveRuntimeOptions} looks at (needs env permission for them). */
export function runtimeEnv(): Record<string, string | undefined> {
  const out: Record<string, string | undefined> = {};
  for (const k of [RUNTIME_ENV, DAWN_FLAGS_ENV]) out[k] = envVar(k);
  return out;
}

/** The help text of the runtime options (serve's spelling). */
export const RUNTIME_HELP =
  `  --webgpu-runtime R        WebGPU runtime: deno (navigator.gpu, default), dawn (npm webgpu),
                            or auto (Dawn where it finds a hardware adapter, else deno);
                            env ${RUNTIME_ENV}
  --dawn-flags LIST         Dawn's create() flags, replacing the defaults (env ${DAWN_FLAGS_ENV};
                            default ${DEFAULT_DAWN_FLAGS.join(",")})
  --dawn-flag KEY=VALUE     set one Dawn flag on top of the list; to enable-/disable-dawn-features
                            it adds its toggles (repeatable)`;
