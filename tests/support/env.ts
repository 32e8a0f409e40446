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
  const restore = setEnv(vars);
  try {
    return await f();
  } finally {
    restore();
  }
}

/**
 * {@link withEnv} for a synchronous `f`: the variables are back before it returns. An `f` that
 * returns a promise throws (its awaited part would run with the variables already put back).
 */
export function withEnvSync<T>(vars: Record<string, string | undefined>, f: () => T): T {
  const restore = setEnv(vars);
  try {
    const out = f();
    if (typeof (out as { then?: unknown } | null)?.then === "function") {
      throw new TypeError("withEnvSync: f returned a promise; use withEnv");
    }
    return out;
  } finally {
    restore();
  }
}

/** Sets `vars` (`undefined` unsets); returns what puts the earlier values back. */
function setEnv(vars: Record<string, string | undefined>): () => void {
  const put = (all: Record<string, string | undefined>) => {
    for (const [k, v] of Object.entries(all)) {
      if (v === undefined) Deno.env.delete(k);
      else Deno.env.set(k, v);
    }
  };
  const before = Object.fromEntries(Object.keys(vars).map((k) => [k, Deno.env.get(k)]));
  put(vars);
  return () => put(before);
}
