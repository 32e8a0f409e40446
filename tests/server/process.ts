/**
 * A real server process for tests: `deno run server/main.ts ARGS` on port 0, its address taken
 * from the "listening on" line, stderr collected, and its exit awaited.
 * @module
 */

import { serverMode } from "./helpers.ts";

const MAIN = new URL("../../server/main.ts", import.meta.url).pathname;
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;

/** A started server process. */
export interface ServerProcess {
  url: string;
  port: number;
  child: Deno.ChildProcess;
  /** Everything it wrote to stderr so far. */
  stderr(): string;
  /** Resolves when it exits: its code and all of stderr. */
  exited: Promise<{ code: number; stderr: string; ms: number }>;
  /** Sends a signal (no-op once exited). */
  kill(sig: Deno.Signal): void;
}

async function collect(stream: ReadableStream<Uint8Array>, sink: (s: string) => void) {
  for await (const s of stream.pipeThrough(new TextDecoderStream())) sink(s);
}

/**
 * Runs main.ts and waits for its listening line. Rejects (with stderr) when it exits first; the
 * exit code is then in the message. `perms` are permissions beyond net, read and env (Dawn's
 * `--allow-ffi`: tests/support/gpu.ts SERVE_RUNTIME).
 */
export async function spawnServer(
  args: readonly string[],
  env: Record<string, string> = {},
  perms: readonly string[] = [],
): Promise<ServerProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--config",
      CONFIG,
      "--allow-net",
      "--allow-read",
      "--allow-env",
      ...perms,
      MAIN,
      "--port",
      "0",
      ...(serverMode.httpWorkers > 0 ? ["--http-workers", String(serverMode.httpWorkers)] : []),
      // The engine serves the main thread or the HTTP workers (not the device threads' own).
      ...(serverMode.engine !== "deno" && !args.includes("--device-threads-http")
        ? ["--http-engine", serverMode.engine]
        : []),
      ...args,
    ],
    env: { XDG_RUNTIME_DIR: "/tmp", ...env },
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let err = "";
  const errDone = collect(child.stderr, (s) => err += s);
  let out = "";
  let listening: (v: string | null) => void;
  const line = new Promise<string | null>((r) => listening = r);
  const outDone = collect(child.stdout, (s) => {
    out += s;
    const m = out.match(/listening on (http:\/\/\S+:(\d+))\n/);
    if (m) listening(m[1]);
  }).finally(() => listening(null));
  let done = false;
  const t0 = performance.now();
  const exited = child.status.then(async (s) => {
    done = true;
    await Promise.all([errDone, outDone]);
    return { code: s.code, stderr: err, ms: performance.now() - t0 };
  });
  const url = await line;
  if (url === null) {
    const e = await exited;
    throw new Error(`server exited with ${e.code} before listening:\n${e.stderr}`);
  }
  const port = Number(url.slice(url.lastIndexOf(":") + 1));
  return {
    url: url.replace("0.0.0.0", "127.0.0.1"),
    port,
    child,
    stderr: () => err,
    exited,
    kill(sig) {
      if (!done) child.kill(sig);
    },
  };
}

/**
 * Runs main.ts to completion (for configurations it must refuse); a server that keeps running
 * is killed after `timeoutMs` and reported with code -1.
 */
export async function runServerToExit(
  args: string[],
  env: Record<string, string> = {},
  timeoutMs = 20_000,
): Promise<{ code: number; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--config", CONFIG, "--allow-net", "--allow-read", "--allow-env", MAIN, ...args],
    env,
    stdout: "null",
    stderr: "piped",
    signal: AbortSignal.timeout(timeoutMs),
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  return { code: out.signal ? -1 : out.code, stderr };
}
