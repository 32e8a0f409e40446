/**
 * Building answers: a JSON body, a safetensors body (in parts, streamed without a copy), and
 * the HEAD form of a GET answer (status and headers, `Content-Length` included, no body).
 * @module
 */

/** The media type of safetensors bodies. */
export const SAFETENSORS = "application/octet-stream";

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

/** A safetensors answer from one buffer or several parts (sent in order, uncopied). */
export function binaryResponse(
  bytes: Uint8Array | Uint8Array[],
  headers?: Record<string, string>,
): Response {
  const parts = Array.isArray(bytes) ? bytes : [bytes];
  const length = parts.reduce((n, p) => n + p.byteLength, 0);
  const body = parts.length === 1 ? parts[0] as Uint8Array<ArrayBuffer> : new ReadableStream({
    start(c) {
      for (const p of parts) c.enqueue(p);
      c.close();
    },
  });
  return new Response(body, {
    status: 200,
    headers: { "content-type": SAFETENSORS, "content-length": String(length), ...headers },
  });
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
