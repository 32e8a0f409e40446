/**
 * Environment variables set for the length of a test's body, then put back as they were
 * (deleted where they were unset).
 * @module
 */

/**
 * Runs `f` with `vars` set (a variable given `undefined` unset), restoring each variable's
 * earlier value (or absence) after.
 */
export async function withEnv<T>(
  vars: Record<string, string | undefined>,
  f: () => T | Promise<T>,
): Promise<T> {
  const before = Object.fromEntries(Object.keys(vars).map((k) => [k, Deno.env.get(k)]));
  for (const [k, v] of Object.entries(vars)) {
    if (v === undefined) Deno.env.delete(k);
    else Deno.env.set(k, v);
  }
  try {
    return await f();
  } finally {
    for (const [k, v] of Object.entries(before)) {
      if (v === undefined) Deno.env.delete(k);
      else Deno.env.set(k, v);
    }
  }
}
