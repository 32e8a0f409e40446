/**
 * A timestamped trace for stalls that leave nothing else behind (bench/NOTES.md v0.7: GPU
 * tests on the H200 that sat minutes with the GPU idle): with `ATTN_TRACE_FILE=PATH` each
 * {@link trace} call appends one line, `ISO-time message`, to PATH synchronously (nothing
 * buffered, so a process killed mid-stall still leaves its last step). Off (one cached check)
 * when the variable is unset.
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
  } catch {
    path = null; // unwritable: stop trying
  }
}
