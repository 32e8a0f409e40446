/**
 * A timestamped trace for stalls that leave nothing else behind (bench/NOTES.md v0.7: GPU
 * tests on the H200 that sat minutes with the GPU idle): with `ATTN_TRACE_FILE=PATH` each
 * {@link trace} call appends one line, `ISO-time message`, to PATH synchronously (nothing
 * buffered, so a process killed mid-stall still leaves its last step). Off (one cached check)
 * when the variable is unset. A PATH it cannot write (a process without `--allow-write`, as
 * `deno task serve` runs) is said once on stderr, and tracing stops.
 * @module
 */
import { envVar } from "./env.ts";

let path: string | null | undefined;

/** Appends `message` with the time to `ATTN_TRACE_FILE`, when set. */
export function trace(message: string): void {
  if (path === undefined) path = envVar("ATTN_TRACE_FILE") || null;
  if (path === null) return;
  try {
    Deno.writeTextFileSync(path, `${new Date().toISOString()} ${message}\n`, { append: true });
  } catch (e) {
    // Unwritable (often a process run without --allow-write): say so once, and stop trying.
    const why = e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied
      ? `; run with --allow-write=${path}`
      : "";
    console.error(`ATTN_TRACE_FILE ${path}: not written, tracing off (${errorText(e)}${why})`);
    path = null;
  }
}

function errorText(e: unknown): string {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}
