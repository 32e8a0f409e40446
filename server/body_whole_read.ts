/**
 * Reading a body of declared length in one piece (Deno's `req.bytes()`), within a budget for the
 * buffers such reads allocate ahead (a body that does not fit is left to its caller to stream:
 * body_stream_read.ts). The budget's count lives here only.
 * @module
 */
import { patientTimeout, wholeBodyDeadlineMs } from "./body_timeout.ts";
import { contentLength } from "./content_length.ts";
import type { StreamedBody } from "./body_read.ts";

/**
 * Bodies read in one piece ({@link wholeBody}) are fast (one op instead of one op and promise a
 * 64 KiB chunk: on the dev VM 71-104 ms against 127-190 ms streamed for 64 MiB), but Deno's
 * `req.bytes()` allocates its buffer from the Content-Length (up to 16 MiB) before a byte
 * arrives, and keeps it until the read ends, which for a stalled body is when its client closes
 * (a 408 does not close the socket): 30 connections declaring 64 MiB and sending 1 KiB held 0.5
 * GB. So the buffers of the reads in flight in this isolate are budgeted: a read takes
 * min(declared, 16 MiB) of {@link WHOLE_READ_BUDGET_BYTES} until `req.bytes()` settles, and a
 * body that does not fit is streamed, its memory following the bytes received.
 */
export const WHOLE_READ_BUDGET_BYTES = 64 * 1024 * 1024;

/** What `req.bytes()` allocates ahead for a declared length, at most (Deno 2.9, measured). */
const WHOLE_READ_AHEAD_MAX = 16 * 1024 * 1024;

let wholeReadBytes = 0;

/**
 * `req`'s body read in one piece when its declared length fits what is left of
 * {@link WHOLE_READ_BUDGET_BYTES}, else null: the caller streams it.
 */
export function wholeBodyIfCheap(req: Request, declared: number): Promise<StreamedBody> | null {
  if (declared < 0) return null;
  const cost = Math.min(declared, WHOLE_READ_AHEAD_MAX);
  if (wholeReadBytes + cost > WHOLE_READ_BUDGET_BYTES) return null;
  wholeReadBytes += cost;
  return wholeBody(req, () => wholeReadBytes -= cost);
}

/**
 * Reads a body of declared length in one piece (Deno's `req.bytes()`: one op, where a stream
 * read takes one op and one promise per 64 KB chunk). A failed read is an `error` end with
 * nothing kept (`uncounted`: Deno does not say how much came). Such a read sees no chunks, so
 * its time limit is a deadline, not a gap: body_timeout.ts `wholeBodyDeadlineMs`.
 */
export async function wholeBody(req: Request, settled?: () => void): Promise<StreamedBody> {
  const limit = wholeBodyDeadlineMs(contentLength(req.headers.get("content-length")));
  const late = patientTimeout(limit);
  const read = req.bytes();
  // A read left behind by a timeout ends when the connection closes; `settled` runs then.
  read.then(settled, settled).catch(() => {});
  try {
    const bytes = await Promise.race([read, late.done]);
    if (bytes === null) {
      return { bytes: new Uint8Array(0), end: "timeout", timeout_ms: limit, uncounted: true };
    }
    return { bytes: aligned(bytes), end: "complete" };
  } catch (e) {
    return { bytes: new Uint8Array(0), end: "error", cause: e, uncounted: true };
  } finally {
    late.cancel();
  }
}

/** Bytes that start 8-byte aligned (safetensors data offsets count from the body's start). */
function aligned(b: Uint8Array): Uint8Array {
  return b.byteOffset % 8 === 0 ? b : b.slice();
}
