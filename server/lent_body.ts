/**
 * Answers whose body is lent memory (a forward's output, read back into a pooled host buffer,
 * gpu/host_pool.ts): the parts go out uncopied through a ReadableStream, and the memory goes
 * back to its pool only when whoever hands the answer on says the bytes are no longer read
 * ({@link releaseWhenDelivered}); until then, and if nobody says so, it is not reused (safe by
 * default: the garbage collector takes it).
 *
 * When that is depends on the consumer:
 * - **Deno.serve** takes a stream body's chunks without copying them (deno_core `JsBuffer` →
 *   `BufView`) and writes them to the socket after the stream handed them over, so the end of
 *   the stream is too early. {@link serveLentBodies} wraps a Deno.serve handler so that the
 *   memory is released when the handler's `info.completed` settles: for a stream body Deno
 *   resolves it from `op_http_set_response_body_resource` once the response finished (on
 *   HTTP/1.1, `write_h1_stream_response` awaits each chunk's write and the final flush first;
 *   deno ext/http/http_next.rs, 2.9), or rejects it when the answer could not be sent (nothing
 *   more is written then). HTTP/2 is not claimed (see {@link serveLentBodies}).
 * - **A consumer that copies** (`await res.arrayBuffer()`, a front that forwards the bytes)
 *   passes the promise of its copy.
 * A Uint8Array body is never used for lent memory: Deno keeps it without saying when it was
 * written (`completed` resolves before such a body is sent).
 * @module
 */
import { partsResponse } from "./responses.ts";
import { concatBytes } from "../core/safetensors.ts";

const lent = new WeakMap<Response, () => void>();
/** Requests whose consumer releases a lent answer once it was delivered. */
const claimed = new WeakSet<Request>();

/**
 * Marks `req` as served by a consumer that releases its answer's lent memory once the answer
 * was delivered or copied (this server's HTTP/1.1 engine, Deno.serve's HTTP/1.1 through
 * {@link serveLentBodies}, a thread hop's owner): its forward may then be lent the device's
 * read-back memory itself (gpu/readback_memory.ts), which must not be unmapped while anything
 * still writes it out.
 */
export function claimLentAnswer(req: Request): void {
  claimed.add(req);
}

/** Whether {@link claimLentAnswer} marked `req`. */
export function lentAnswerClaimed(req: Request): boolean {
  return claimed.has(req);
}
/** The parts of each lent answer, for {@link takeLentBytes}. */
const lentParts = new WeakMap<Response, Uint8Array[]>();

/** An answer streaming `parts` (in order, uncopied), with Content-Length; `release` lent. */
export function lentBodyResponse(
  parts: Uint8Array[],
  release: () => void,
  init: { status?: number; headers: Record<string, string> },
): Response {
  const res = partsResponse(parts, init);
  lent.set(res, release);
  lentParts.set(res, parts);
  return res;
}

/**
 * A lent answer's body as one new buffer, copied straight from its parts (not through its
 * stream: a thread hop's owner, request_owner.ts, spends ~20 us on a decode answer this way
 * against ~90 us reading the stream, dev VM), and its memory released at once; null for any
 * other answer, or one whose body was read already.
 */
export function takeLentBytes(res: Response): ArrayBuffer | null {
  const parts = lentParts.get(res);
  const release = lent.get(res);
  if (!parts || !release || res.bodyUsed) return null;
  lentParts.delete(res);
  lent.delete(res);
  const out = concatBytes(parts);
  release();
  return out.buffer as ArrayBuffer;
}

/**
 * Releases `res`'s lent body memory (if it has any) once `settled` settles, resolved or
 * rejected: Deno.serve's `info.completed`, or the consumer's own copy of the body. At most once.
 */
export function releaseWhenDelivered(res: Response, settled: Promise<unknown>): void {
  const release = lent.get(res);
  if (!release) return;
  lent.delete(res);
  settled.then(release, release);
}

/**
 * A Deno.serve handler that tells lent answer bodies when Deno delivered them, on HTTP/1.1.
 * A request without a Host header (HTTP/2, whose requests carry `:authority` instead, or an
 * HTTP/1.0 one) is left unclaimed: Deno serves HTTP/2 through hyper, which resolves
 * `completed` when it drops the body, possibly before the last DATA frames it buffered are
 * sent, so that memory is never reused (the garbage collector takes it).
 */
export function serveLentBodies(
  handler: (req: Request) => Promise<Response>,
): (req: Request, info: Deno.ServeHandlerInfo) => Promise<Response> {
  return async (req, info) => {
    const claims = req.headers.has("host");
    if (claims) claimLentAnswer(req);
    const res = await handler(req);
    if (lent.has(res) && claims) releaseWhenDelivered(res, info.completed);
    return res;
  };
}
