/**
 * How a body read on a connection of the service's own HTTP/1.1 server (http1_reader.ts) ends
 * early: its gap limit, kept by one timer, and what such a read that timed out or whose client
 * closed gives back.
 * @module
 */
import { patientTimeout } from "./body_timeout.ts";
import type { StreamedBody } from "./body_read.ts";

/**
 * A body read's gap limit with one timer, not one a socket read: it fires `gapMs` after the
 * last progress, re-arming itself while progress keeps coming. Each wait is body_timeout.ts's
 * `patientTimeout`, as every other body read's: a timer that fired late because the thread was
 * busy waits once more before it counts.
 */
export class GapTimer {
  #last = performance.now();
  #wait: { done: Promise<null>; cancel(): void } | undefined;
  #fire!: (v: "timeout") => void;
  readonly done = new Promise<"timeout">((r) => this.#fire = r);

  constructor(readonly gapMs: number) {
    this.#arm(gapMs);
  }

  #arm(ms: number): void {
    const wait = this.#wait = patientTimeout(ms);
    wait.done.then(() => {
      if (wait !== this.#wait) return; // cancelled
      const left = this.#last + this.gapMs - performance.now();
      if (left > 0) this.#arm(left);
      else this.#fire("timeout");
    });
  }

  progress(): void {
    this.#last = performance.now();
  }

  cancel(): void {
    this.#wait?.cancel();
    this.#wait = undefined;
  }
}

/** A body read that ended early: a `timeout` (`gapMs` without bytes) or the connection closed. */
export function ended(r: "eof" | "timeout", bytes: Uint8Array, gapMs: number): StreamedBody {
  if (r === "timeout") return { bytes, end: "timeout", timeout_ms: gapMs };
  return { bytes, end: "error", cause: new Error("the connection closed") };
}
