/**
 * The parent side of `--keep-warm-mode process`: starts gpu/keep_warm_child.ts as a Deno
 * process of its own (same Deno, the project's config, Dawn's flags), re-arms its hold window
 * by writing a byte to its stdin (at most every `hold_ms / 8`, never awaited by the caller), reads
 * its JSON status lines, and ends it by closing its stdin. A server without `--allow-run`, a
 * child that finds no adapter, or one that does not answer in time is a stated reason, never an
 * exception.
 * @module
 */
import { fileURLToPath } from "node:url";
import type { ChildConfig } from "./keep_warm_child.ts";
import { raceTimeout } from "../core/timeout.ts";

/** The child's state as its last status lines said. */
export interface ChildStats {
  adapter: string;
  /** One spin's device time measured by the child at start, ms. */
  spin_ms: number;
  spinning: boolean;
  dispatches: number;
  /** Set when the child ended before {@link KeepWarmChild.close}: how. */
  ended?: string;
}

const CHILD = new URL("./keep_warm_child.ts", import.meta.url);
const CONFIG = new URL("../deno.json", import.meta.url);
const path = (u: URL) => (u.protocol === "file:" ? fileURLToPath(u) : u.href);
const why = (e: unknown) => (e instanceof Error ? e.message.split("\n")[0] : String(e));

/** A running spinner process (module doc). */
export class KeepWarmChild {
  readonly #proc: Deno.ChildProcess;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;
  readonly #minGap: number;
  readonly #stats: ChildStats;
  #lastPing = -Infinity;
  #writing = false;
  #closed = false;
  #following: Promise<void> = Promise.resolve();

  private constructor(
    proc: Deno.ChildProcess,
    stdin: WritableStreamDefaultWriter<Uint8Array>,
    holdMs: number,
    stats: ChildStats,
  ) {
    this.#proc = proc;
    this.#stdin = stdin;
    this.#minGap = holdMs / 8;
    this.#stats = stats;
  }

  /** Starts the child and waits for its first line (`timeoutMs`), or says why it cannot. */
  static async start(c: ChildConfig, timeoutMs = 60_000): Promise<KeepWarmChild | string> {
    let proc: Deno.ChildProcess;
    try {
      proc = new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "--allow-read",
          "--allow-env",
          "--allow-ffi",
          "--no-prompt",
          "--config",
          path(CONFIG),
          path(CHILD),
          JSON.stringify(c),
        ],
        stdin: "piped",
        stdout: "piped",
        stderr: "null",
      }).spawn();
    } catch (e) {
      return e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied
        ? "the process mode needs --allow-run (it starts a Deno process of its own)"
        : `cannot start the spinner process: ${why(e)}`;
    }
    const lines = proc.stdout.pipeThrough(new TextDecoderStream()).pipeThrough(splitLines());
    const reader = lines.getReader();
    const stdin = proc.stdin.getWriter();
    const first = await raceTimeout(reader.read().then((r) => r.done ? null : r.value), timeoutMs);
    const hello = first === "timeout" || first === null ? null : parse(first);
    if (!hello || hello.ok !== true) {
      await endChild(proc, stdin);
      await reader.cancel().catch(() => {});
      return first === "timeout"
        ? `the spinner process did not answer in ${timeoutMs} ms`
        : `the spinner process: ${String(hello?.reason ?? "exited without a word")}`;
    }
    const stats: ChildStats = {
      adapter: String(hello.adapter),
      spin_ms: Number(hello.spin_ms),
      spinning: false,
      dispatches: 0,
    };
    const child = new KeepWarmChild(proc, stdin, c.hold_ms, stats);
    child.#following = child.#follow(reader);
    return child;
  }

  /** Re-arms the child's window (throttled; the write is not awaited). */
  ping(): void {
    const now = performance.now();
    if (this.#closed || this.#writing || now - this.#lastPing < this.#minGap) return;
    this.#lastPing = now;
    this.#writing = true;
    this.#stdin.write(Uint8Array.of(1)).catch(() => {}).finally(() => this.#writing = false);
  }

  /** The child's process id. */
  get pid(): number {
    return this.#proc.pid;
  }

  /** What the child said last. */
  stats(): ChildStats {
    return { ...this.#stats };
  }

  /** Ends the child (its stdin closed; killed if it has not exited within 5 s). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await endChild(this.#proc, this.#stdin);
    await this.#following;
  }

  async #follow(reader: ReadableStreamDefaultReader<string>): Promise<void> {
    try {
      for (let r = await reader.read(); !r.done; r = await reader.read()) {
        const o = parse(r.value);
        if (o && typeof o.spinning === "boolean") {
          this.#stats.spinning = o.spinning;
          this.#stats.dispatches = Number(o.dispatches);
        }
      }
    } catch { /* the child ended */ }
    if (!this.#closed) {
      const st = await this.#proc.status;
      this.#stats.spinning = false;
      this.#stats.ended = `the spinner process ended (${
        st.signal ? `signal ${st.signal}` : `status ${st.code}`
      })`;
    }
  }
}

async function endChild(p: Deno.ChildProcess, stdin: WritableStreamDefaultWriter<Uint8Array>) {
  await stdin.close().catch(() => {});
  let timer: ReturnType<typeof setTimeout> | undefined;
  const killed = new Promise<void>((r) =>
    timer = setTimeout(() => {
      try {
        p.kill("SIGKILL");
      } catch { /* gone */ }
      r();
    }, 5000)
  );
  await Promise.race([p.status, killed]);
  await p.status;
  clearTimeout(timer);
}

function parse(line: string): Record<string, unknown> | null {
  try {
    const o = JSON.parse(line);
    return o && typeof o === "object" ? o : null;
  } catch {
    return null;
  }
}

/** A stream of text chunks as lines. */
function splitLines(): TransformStream<string, string> {
  let rest = "";
  return new TransformStream({
    transform(chunk, ctl) {
      const parts = (rest + chunk).split("\n");
      rest = parts.pop()!;
      for (const p of parts) if (p) ctl.enqueue(p);
    },
    flush(ctl) {
      if (rest) ctl.enqueue(rest);
    },
  });
}
