/**
 * Where the nginx binary is, for the deploy/ tests (they skip without one).
 * @module
 */

/** The nginx binary in PATH, /usr/sbin or /usr/local/sbin, or null. */
export function findNginx(): string | null {
  const dirs = [...(Deno.env.get("PATH") ?? "").split(":"), "/usr/sbin", "/usr/local/sbin"];
  for (const d of dirs) {
    try {
      if (d && Deno.statSync(`${d}/nginx`).isFile) return `${d}/nginx`;
    } catch { /* not here */ }
  }
  return null;
}
