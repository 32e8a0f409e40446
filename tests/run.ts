/**
 * `deno task test`: the suite in two passes of `deno test`.
 *
 * 1. Every test file but those below, in parallel (`--parallel`: one worker a CPU, `DENO_JOBS`
 *    sets another count), with the doc tests of mod.ts.
 * 2. The files that change what the process shares, one at a time: environment variables
 *    (`withEnv`, `Deno.env.set`/`delete`) and file descriptor 2 (`captureStderr`). Modules of a
 *    parallel pass are workers of one process: one file's `ATTN_EARLY_READ=yes` reached
 *    another's device set-up (an uncaught EnvValueError, seen on the first parallel run). A
 *    file is picked by what its text calls, so a new one lands in the right pass by itself.
 *
 * Arguments that name files or folders (that exist) run one plain `deno test` over them
 * (`deno task test tests/gpu`); otherwise they go to both passes (`deno task test --filter
 * decode`). The exit status is the first failing pass's (a pass killed by a signal: 128 + its
 * number, so CI can tell a SIGABRT at exit from a failure), else 0.
 * @module
 */

/** The permissions every pass runs with. */
export const TEST_FLAGS = [
  "--allow-net",
  "--allow-read",
  "--allow-env",
  "--allow-run",
  "--allow-write=/tmp",
  "--allow-ffi",
];

/** What in a test file's text makes it change process-wide state. */
export const SERIAL_MARK = /\bwithEnv(Sync)?\(|Deno\.env\.(set|delete)\(|\bcaptureStderr\(/;

const ROOT = new URL("..", import.meta.url);
const TESTS = new URL("./", import.meta.url);

/** The files under `dir` whose name `keep` takes, as paths relative to the repository root, sorted. */
export async function filesUnder(dir: URL, keep: (name: string) => boolean): Promise<string[]> {
  const out: string[] = [];
  for await (const e of Deno.readDir(dir)) {
    const url = new URL(e.name + (e.isDirectory ? "/" : ""), dir);
    if (e.isDirectory) out.push(...await filesUnder(url, keep));
    else if (e.isFile && keep(e.name)) out.push(url.pathname.slice(ROOT.pathname.length));
  }
  return out.sort();
}

/** The `*_test.ts` files under tests/, as paths relative to the repository root, sorted. */
export function testFiles(): Promise<string[]> {
  return filesUnder(TESTS, (name) => name.endsWith("_test.ts"));
}

/** `files` split by {@link SERIAL_MARK}: those free to share a process, and the rest. */
export async function splitFiles(
  files: string[],
  root: URL = ROOT,
): Promise<{ parallel: string[]; serial: string[] }> {
  const parallel: string[] = [], serial: string[] = [];
  for (const f of files) {
    (SERIAL_MARK.test(await Deno.readTextFile(new URL(f, root))) ? serial : parallel).push(f);
  }
  return { parallel, serial };
}

/** Runs `deno test` with `args` in the repository root; its exit status (signals as 128 + n). */
async function denoTest(args: string[]): Promise<number> {
  const { code, signal } = await new Deno.Command(Deno.execPath(), {
    args: ["test", ...TEST_FLAGS, ...args],
    cwd: ROOT.pathname,
    stdin: "null",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn().status;
  return signal === null ? code : 128 + signalNumber(signal);
}

/** The number of signal `s` on Linux (0 for one not listed: the status is then 128). */
function signalNumber(s: Deno.Signal): number {
  const known: Partial<Record<Deno.Signal, number>> = {
    SIGHUP: 1,
    SIGINT: 2,
    SIGQUIT: 3,
    SIGILL: 4,
    SIGABRT: 6,
    SIGKILL: 9,
    SIGSEGV: 11,
    SIGTERM: 15,
  };
  return known[s] ?? 0;
}

/** Whether `arg` names a file or folder (not a flag, nor a flag's value such as a filter). */
async function isPath(arg: string): Promise<boolean> {
  if (arg.startsWith("-")) return false;
  try {
    await Deno.stat(arg);
    return true;
  } catch {
    return false;
  }
}

async function main(args: string[]): Promise<number> {
  for (const a of args) if (await isPath(a)) return await denoTest(args);
  const { parallel, serial } = await splitFiles(await testFiles());
  const first = await denoTest(["--parallel", ...args, "--doc", "mod.ts", ...parallel]);
  const second = serial.length > 0 ? await denoTest([...args, ...serial]) : 0;
  return first !== 0 ? first : second;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
