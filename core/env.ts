/**
 * Environment variables read without failing: a process started without `--allow-env` (or
 * without permission for that name) sees every variable as unset.
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
