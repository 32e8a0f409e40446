/**
 * What the deploy/ tests share: where the nginx binary is (they skip without one), free ports,
 * whether a process lives, and a polling wait.
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

/**
 * The ports {@link freePorts} draws from: `ATTN_TEST_PORTS=LOW-HIGH` (e.g. 39100-39199, where test
 * runs that share a machine are each given a range), else 20000-49999.
 */
function portRange(): { low: number; high: number } {
  const m = /^(\d+)-(\d+)$/.exec(Deno.env.get("ATTN_TEST_PORTS") ?? "");
  return m ? { low: Number(m[1]), high: Number(m[2]) } : { low: 20000, high: 49999 };
}

/** A free port and, after it, `count` consecutive free ports (probed by listening). */
export function freePorts(count: number): { port: number; base: number } {
  const { low, high } = portRange();
  const free = (p: number) => {
    try {
      Deno.listen({ hostname: "127.0.0.1", port: p }).close();
      return true;
    } catch {
      return false;
    }
  };
  for (let tries = 0; tries < 200; tries++) {
    const port = low + Math.floor(Math.random() * (high - low - count + 1));
    const all = Array.from({ length: count + 1 }, (_, i) => port + i);
    if (all.every(free)) return { port, base: port + 1 };
  }
  throw new Error("no free ports");
}

export const alive = (pid: number) => {
  try {
    return Deno.statSync(`/proc/${pid}`).isDirectory;
  } catch {
    return false;
  }
};

export async function waitFor(what: string, ms: number, ok: () => Promise<boolean> | boolean) {
  const end = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Waits (60 s at most) for deploy/start.sh's `PREFIX/ready`; fails at once with its output when
 * the script exits first.
 */
export async function waitForStart(
  prefix: string,
  script: Deno.ChildProcess,
  logs: Promise<string[]>,
): Promise<void> {
  await waitFor("deploy/start.sh to be ready", 60_000, async () => {
    try {
      return (await Deno.stat(`${prefix}/ready`)).isFile;
    } catch {
      const done = await Promise.race([script.status, Promise.resolve(null)]);
      if (done) throw new Error(`start.sh exited ${done.code}: ${(await logs).join("\n")}`);
      return false;
    }
  });
}

/** One instance start.sh started, as PREFIX/instances.tsv lists it. */
export interface StartedInstance {
  name: string;
  port: number;
  pid: number;
}

/** PREFIX/instances.tsv's rows ("name port pid"), once start.sh wrote it. */
export async function readInstances(prefix: string): Promise<StartedInstance[]> {
  const rows = (await Deno.readTextFile(`${prefix}/instances.tsv`)).trim().split("\n");
  return rows.map((l) => l.split("\t")).map(([name, p, pid]) => ({
    name,
    port: Number(p),
    pid: Number(pid),
  }));
}
