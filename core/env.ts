/**
 * Environment variables read without failing: a process started without `--allow-env` (or
 * without permission for that name) sees every variable as unset.
 *
 * And the settings made of them ({@link EnvSetting}): each variable's rule lives in the module
 * that reads it, as one setting (its name, its value when unset, and the strict parse of any
 * other text), which that module reads with {@link readSetting} and server/serve_env.ts checks
 * at start-up with {@link settingValue}: one rule, two callers. The rules share one convention:
 * unset and empty are the default; anything else must be exactly what the rule says (no
 * surrounding whitespace, no sign, no exponent, no hex, enum values in their case), else the
 * read throws an {@link EnvValueError} naming the variable and its value.
 * @module
 */

/** The variable's value, or undefined where it is unset or may not be read. */
export function envVar(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

/** A variable's value its rule refuses: the message names the variable and the value. */
export class EnvValueError extends Error {
  /** The variable's name. */
  readonly variable: string;
  /** Its value, as read. */
  readonly value: string;
  constructor(variable: string, value: string, message: string) {
    super(message);
    this.name = "EnvValueError";
    this.variable = variable;
    this.value = value;
  }
}

/**
 * `parse()` of variable `name`'s `value`, any Error it throws an EnvValueError with the same
 * message: a server prints it alone, without the usage a bad flag gets (no flag was wrong).
 */
export function parseVariable<T>(name: string, value: string, parse: () => T): T {
  try {
    return parse();
  } catch (e) {
    if (e instanceof EnvValueError) throw e;
    throw new EnvValueError(name, value, e instanceof Error ? e.message : String(e));
  }
}

/** An environment variable's rule, owned by the module that reads it. */
export interface EnvSetting<T> {
  /** The variable's name. */
  readonly name: string;
  /** Its value when unset or empty. */
  readonly unset: T;
  /**
   * The value of any other text.
   * @throws EnvValueError naming the variable and `text` where the rule refuses it.
   */
  parse(text: string): T;
}

/** `s`'s value for `text`, the variable's text (undefined or empty: unset). */
export function settingValue<T>(s: EnvSetting<T>, text: string | undefined): T {
  return text === undefined || text === "" ? s.unset : s.parse(text);
}

/**
 * `s`'s value in this process's environment, read now.
 * @throws EnvValueError where the rule refuses the variable's value.
 */
export function readSetting<T>(s: EnvSetting<T>): T {
  return settingValue(s, envVar(s.name));
}

/** The error "`name` must be `must`, got `text`" (and `why`, where given). */
export function mustBe(name: string, text: string, must: string, why?: string): EnvValueError {
  const tail = why === undefined ? "" : `: ${why}`;
  return new EnvValueError(
    name,
    text,
    `${name} must be ${must}, got ${JSON.stringify(text)}${tail}`,
  );
}

/**
 * `text` as an integer from `min` to `max` (decimal digits only; leading zeros allowed).
 * `unit` is said after the range (" (ms)").
 * @throws EnvValueError otherwise.
 */
export function envInt(
  name: string,
  text: string,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
  unit = "",
): number {
  const n = Number(text);
  if (/^\d+$/.test(text) && n >= min && n <= max) return n;
  const range = max === Number.MAX_SAFE_INTEGER
    ? `an integer >= ${min}`
    : `an integer from ${min} to ${max}`;
  throw mustBe(name, text, range + unit);
}

/** `text` as one of `values`, exactly. @throws EnvValueError otherwise. */
export function envOneOf<T extends string>(name: string, text: string, values: readonly T[]): T {
  const v = values.find((x) => x === text);
  if (v === undefined) throw mustBe(name, text, `one of ${values.join(", ")}`);
  return v;
}

/** `text` as a switch: `0` off, `1` on. @throws EnvValueError otherwise. */
export function envSwitch(name: string, text: string): boolean {
  if (text !== "0" && text !== "1") throw mustBe(name, text, "0 (off) or 1 (on)");
  return text === "1";
}

/** The setting of a switch `name` ({@link envSwitch}): `unset` when unset or empty. */
export function switchSetting<U>(name: string, unset: U): EnvSetting<boolean | U> {
  return { name, unset, parse: (text) => envSwitch(name, text) };
}
