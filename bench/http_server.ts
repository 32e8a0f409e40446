/**
 * Starts the real server (`deno run ... server/main.ts --port 0 [flags]`) as a subprocess for
 * the HTTP bench, with the permissions `deno task serve` grants (`--allow-ffi` for Dawn's
 * Node-API addon, `--allow-run` for `--keep-warm-mode process`), and reads its "listening on
 * http://HOST:PORT" line. Its stderr is drained all along (a full pipe would stall the server) and its tail kept, so a server
 * that exits before listening (e.g. a WebGPU runtime that cannot start) is reported with its
 * own reason.
 * @module
 */
import { fileURLToPath as fromFileUrl } from "node:url";
import { raceTimeout } from "../core/timeout.ts";

/** A running server. */
export interface ServerProcess {
  url: string;
  pid: number;
  /** ms from spawn to the listening line. */
  startup_ms: number;
  /** The stderr seen so far (its last 16 KiB). */
  stderr(): string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves to the exit code. */
  stop(graceMs?: number): Promise<number>;
}

/** What starting gave: a server, or why there is none. */
export type Started =
  | { ok: true; server: ServerProcess }
  | { ok: false; code: number | null; reason: string };

const KEEP = 16 * 1024;

/** Servers started and not yet stopped (for {@link killStarted}). */
const live = new Set<Deno.ChildProcess>();

/** SIGKILLs every server started here and not stopped yet (for the bench's signal handler). */
export function killStarted(): void {
  for (const child of live) {
    try {
      child.kill("SIGKILL");
    } catch { /* already gone */ }
  }
  live.clear();
}

/** ANSI colour and cursor sequences (Deno colours its errors). */
const ANSI = new RegExp(String.fromCharCode(27) + "\\[[0-9;]*[A-Za-z]", "g");

async function drain(stream: ReadableStream<Uint8Array>, onText: (s: string) => void) {
  const dec = new TextDecoder();
  try {
    for await (const chunk of stream) onText(dec.decode(chunk, { stream: true }).replace(ANSI, ""));
  } catch { /* the process went away */ }
}

/**
 * Write permission for `ATTN_TRACE_FILE` alone, when it is set: the server inherits the
 * variable, and without the permission core/trace.ts can only say it traces nothing.
 */
function traceWrite(): string[] {
  const file = Deno.env.get("ATTN_TRACE_FILE");
  return file ? [`--allow-write=${file}`] : [];
}

/**
 * Spawns the server with `args` after `--port 0`; waits up to `timeoutMs` for its listening
 * line. A server that exits first, or does not listen in time (it is killed), is not ok.
 */
export async function startServer(args: string[], timeoutMs = 180_000): Promise<Started> {
  const root = fromFileUrl(new URL("..", import.meta.url));
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-net",
      "--allow-read",
      "--allow-env",
      "--allow-ffi",
      "--allow-run",
      ...traceWrite(),
      fromFileUrl(new URL("../server/main.ts", import.meta.url)),
      "--port",
      "0",
      ...args,
    ],
    cwd: root,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  live.add(child);
  child.status.then(() => live.delete(child));
  const t0 = performance.now();
  let err = "", out = "";
  const stderrDone = drain(child.stderr, (s) => err = (err + s).slice(-KEEP));
  let listening: (url: string) => void = () => {};
  const url = new Promise<string>((resolve) => listening = resolve);
  const stdoutDone = drain(child.stdout, (s) => {
    out = (out + s).slice(-KEEP);
    const m = out.match(/listening on (http:\/\/\S+?)\s/);
    if (m) listening(m[1]);
  });
  const first = await raceTimeout(Promise.race([url, child.status]), timeoutMs);
  if (typeof first === "string" && first !== "timeout") {
    const server: ServerProcess = {
      url: first.replace(/\/+$/, ""),
      pid: child.pid,
      startup_ms: performance.now() - t0,
      stderr: () => err,
      async stop(graceMs = 15_000) {
        try {
          child.kill("SIGTERM");
        } catch { /* already gone */ }
        const kill = setTimeout(() => {
          try {
            child.kill("SIGKILL");
          } catch { /* already gone */ }
        }, graceMs);
        const st = await child.status;
        clearTimeout(kill);
        await Promise.all([stderrDone, stdoutDone]);
        return st.code;
      },
    };
    return { ok: true, server };
  }
  if (first === "timeout") {
    try {
      child.kill("SIGKILL");
    } catch { /* already gone */ }
  }
  const st = await child.status;
  await Promise.all([stderrDone, stdoutDone]);
  const why = first === "timeout"
    ? `no listening line within ${timeoutMs} ms`
    : `exited with code ${st.code} before listening`;
  return {
    ok: false,
    code: first === "timeout" ? null : st.code,
    reason: `${why}: ${(err || out).trim()}`,
  };
}
