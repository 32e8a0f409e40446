/**
 * Reading a request body from its stream, chunk by chunk, into a {@link BodyBuffer} within a
 * size limit and body_timeout.ts's gap limit.
 * @module
 */
import { BodyBuffer } from "./body_buffer.ts";
import { bodyTimeoutMs, readWithin } from "./body_timeout.ts";
import type { StreamedBody } from "./body_read.ts";

/**
 * Reads a body stream chunk by chunk into a {@link BodyBuffer}, counting bytes against
 * `limit`. Once the declared length has arrived the stream is read once more, to its end:
 * Deno's server answers a request whose body stream is left open about 0.1 ms later (measured
 * on loopback). That last read failing (a client that half-closes after its last byte) is no
 * error: the body is whole. Used by {@link readBody} and by the HTTP workers.
 */
export async function streamBody(
  stream: ReadableStream<Uint8Array>,
  declared: number,
  limit: number,
): Promise<StreamedBody> {
  const reader = stream.getReader();
  const body = new BodyBuffer(declared);
  let end: StreamedBody["end"] = "complete";
  let cause: unknown;
  const ms = bodyTimeoutMs();
  while (declared < 0 || body.total < declared) {
    let chunk: ReadableStreamReadResult<Uint8Array> | null;
    try {
      chunk = await readWithin(reader, ms);
    } catch (e) {
      end = "error";
      cause = e;
      break;
    }
    if (chunk === null) {
      reader.releaseLock(); // the read left pending fails once the stream is cancelled
      await stream.cancel().catch(() => {});
      return { bytes: body.bytes(), end: "timeout", timeout_ms: ms };
    }
    if (chunk.done) break;
    body.add(chunk.value);
    if (body.total > limit) {
      end = "too_large";
      await reader.cancel().catch(() => {});
      break;
    }
  }
  if (end === "complete" && declared >= 0 && body.total >= declared) {
    await reader.read().catch(() => {});
  }
  reader.releaseLock();
  return { bytes: body.bytes(), end, cause };
}
