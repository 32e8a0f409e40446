/**
 * A chunked request body (RFC 9112 7.1) read from a connection of the service's own HTTP/1.1
 * server through its reader's buffer, trailer fields read and dropped: {@link readChunkedBody},
 * which {@link ConnReader} `chunkedBody` calls.
 * @module
 */
import { BodyBuffer } from "./body_buffer.ts";
import { BodyFramingError, type StreamedBody } from "./body_read.ts";
import { isoLatin1 } from "./http1_head.ts";
import type { ConnReader } from "./http1_reader.ts";
import { ended } from "./http1_body_gap.ts";

/** A chunked body (RFC 9112 7.1), trailer fields read and dropped. */
export async function readChunkedBody(
  reader: ConnReader,
  limit: number,
  gapMs: number,
): Promise<StreamedBody> {
  const body = new BodyBuffer(-1);
  const failed = (why: string): StreamedBody => ({
    bytes: body.bytes(),
    end: "error",
    cause: new BodyFramingError(why),
  });
  for (;;) {
    const line = await readLine(reader, gapMs);
    if (typeof line !== "object") return chunkEnd(line, body, gapMs);
    // 1*HEXDIG (RFC 9112 7.1): leading zeros are not counted against the 12 digits.
    const m = /^(?=[0-9a-fA-F])0*([0-9a-fA-F]*)[ \t]*(;.*)?$/.exec(line.text);
    if (!m) {
      return failed(`chunk size line ${JSON.stringify(line.text.slice(0, 64))} is not valid`);
    }
    // 13 or more significant digits: valid, and over any body limit (2^48 bytes and up).
    if (m[1].length > 12) return { bytes: body.bytes(), end: "too_large" };
    const size = m[1] === "" ? 0 : parseInt(m[1], 16);
    if (size === 0) break;
    if (body.total + size > limit) return { bytes: body.bytes(), end: "too_large" };
    let left = size;
    while (left > 0) {
      if (reader.available === 0) {
        const r = await reader.fill(gapMs);
        if (r !== "data") return chunkEnd(r, body, gapMs);
      }
      const take = Math.min(left, reader.available);
      body.add(reader.buf.slice(reader.start, reader.start + take));
      reader.consume(take);
      left -= take;
    }
    const crlf = await readLine(reader, gapMs);
    if (typeof crlf !== "object") return chunkEnd(crlf, body, gapMs);
    if (crlf.text !== "") return failed("chunk data not followed by CRLF");
  }
  for (let fields = 0;; fields++) { // trailer section
    const line = await readLine(reader, gapMs);
    if (typeof line !== "object") return chunkEnd(line, body, gapMs);
    if (line.text === "") return { bytes: body.bytes(), end: "complete" };
    if (fields > 256) return failed("trailer section over 256 fields");
  }
}

function chunkEnd(
  r: "eof" | "timeout" | "too_long",
  body: BodyBuffer,
  gapMs: number,
): StreamedBody {
  if (r === "too_long") {
    return {
      bytes: body.bytes(),
      end: "error",
      cause: new BodyFramingError("a chunk line is over 4096 bytes"),
    };
  }
  return ended(r, body.bytes(), gapMs);
}

/** One CRLF-ended line (at most 4 KiB), without its CRLF. */
async function readLine(
  reader: ConnReader,
  ms: number,
): Promise<{ text: string } | "eof" | "timeout" | "too_long"> {
  for (;;) {
    // At most 4096 bytes and its CRLF, however much has arrived: a longer line that came in
    // one read was taken, one that came in two refused.
    const stop = Math.min(reader.end, reader.start + 4098);
    for (let i = reader.start + 1; i < stop; i++) {
      if (reader.buf[i] === 10 && reader.buf[i - 1] === 13) {
        const text = isoLatin1(reader.buf.subarray(reader.start, i - 1));
        reader.consume(i + 1 - reader.start);
        return { text };
      }
    }
    if (reader.available >= 4098) return "too_long";
    const r = await reader.fill(ms);
    if (r !== "data") return r;
  }
}
