/**
 * Building answers: a JSON body, a safetensors body (in parts, streamed without a copy), the
 * HEAD form of a GET answer (status and headers, `Content-Length` included, no body), and the
 * instance name on every answer.
 * @module
 */
import { INSTANCE_HEADER } from "../wire/names.ts";

/**
 * The parts of each answer built here from bytes ({@link partsResponse}, {@link binaryResponse}),
 * for a server that writes them itself (http1_write.ts) instead of reading the Response's body.
 */
const bodyParts = new WeakMap<Response, Uint8Array[]>();

/** The bytes `res`'s body is made of, uncopied, where it was built from bytes here. */
export function bodyPartsOf(res: Response): Uint8Array[] | undefined {
  return bodyParts.get(res);
}

/** The media type of safetensors bodies. */
export const SAFETENSORS = "application/octet-stream";

/** `/healthz`'s body: `{"status":"ok"}`, with the instance's name where it has one. */
export function healthDocument(instance: string | undefined): Record<string, string> {
  return instance === undefined ? { status: "ok" } : { status: "ok", instance };
}

/** A JSON answer. */
export function jsonResponse(
  body: unknown,
  status = 200,
  headers?: Record<string, string>,
): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

/**
 * An answer streaming `parts` in order, uncopied, one part per pull (nothing is pulled ahead),
 * with their total as Content-Length.
 */
export function partsResponse(
  parts: Uint8Array[],
  init: { status?: number; headers?: Record<string, string> },
): Response {
  let next = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (next < parts.length) c.enqueue(parts[next++]);
      else c.close();
    },
  }, { highWaterMark: 0 });
  const length = parts.reduce((n, p) => n + p.byteLength, 0);
  const res = new Response(body, {
    status: init.status ?? 200,
    headers: { ...init.headers, "content-length": String(length) },
  });
  bodyParts.set(res, parts);
  return res;
}

/** A safetensors answer from one buffer (sent as it is) or several parts (streamed, uncopied). */
export function binaryResponse(
  bytes: Uint8Array | Uint8Array[],
  headers?: Record<string, string>,
): Response {
  const all = { "content-type": SAFETENSORS, ...headers };
  if (Array.isArray(bytes) && bytes.length !== 1) return partsResponse(bytes, { headers: all });
  const one = (Array.isArray(bytes) ? bytes[0] : bytes) as Uint8Array<ArrayBuffer>;
  const res = new Response(one, {
    status: 200,
    headers: { ...all, "content-length": String(one.byteLength) },
  });
  bodyParts.set(res, [one]);
  return res;
}

/** The answer to a HEAD request: the GET answer's status and headers, no body. */
export async function headOf(res: Response): Promise<Response> {
  const headers = new Headers(res.headers);
  if (res.body && !headers.has("content-length")) {
    headers.set("content-length", String((await res.arrayBuffer()).byteLength));
  } else {
    await res.body?.cancel();
  }
  return new Response(null, { status: res.status, headers });
}

/**
 * `handler` with `X-Attention-Instance: name` on every answer (the drainer's own 503s included,
 * when it wraps the drainer), or `handler` itself when the server has no name.
 */
export function named(
  handler: (req: Request) => Promise<Response>,
  name: string | undefined,
): (req: Request) => Promise<Response> {
  if (name === undefined) return handler;
  return async (req) => {
    const res = await handler(req);
    res.headers.set(INSTANCE_HEADER, name);
    return res;
  };
}
