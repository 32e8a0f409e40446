/**
 * Request bodies: media types (JSON or safetensors, else 415), the size limit (Content-Length
 * checked before reading, bytes counted while streaming so chunked bodies are capped too: 413),
 * JSON parsing (400), and `Accept` negotiation between JSON and safetensors responses.
 * @module
 */
import { ServiceError } from "../core/errors.ts";

/** Default body limit: 512 MiB. */
export const DEFAULT_MAX_BODY_BYTES = 512 * 1024 * 1024;

/** The body kinds a route may take. */
export type BodyKind = "json" | "binary";

/** The media type of a Content-Type header (lower case, parameters dropped), or "". */
export function mediaType(header: string | null): string {
  return (header ?? "").split(";")[0].trim().toLowerCase();
}

/** JSON-ish media types: application/json and any `+json` suffix. */
export function isJsonType(mt: string): boolean {
  return mt === "application/json" || (mt.startsWith("application/") && mt.endsWith("+json"));
}

/** Which body kind a request carries, or 415 when it is none of `accepted`. */
export function bodyKind(req: Request, accepted: BodyKind[]): BodyKind {
  const mt = mediaType(req.headers.get("content-type"));
  if (isJsonType(mt) && accepted.includes("json")) return "json";
  if (mt === "application/octet-stream" && accepted.includes("binary")) return "binary";
  const names = accepted.map((
    k,
  ) => (k === "json" ? "application/json" : "application/octet-stream (safetensors)"));
  throw new ServiceError(
    `unsupported Content-Type ${JSON.stringify(mt || "(none)")}; this endpoint accepts ${
      names.join(" or ")
    }`,
    {
      status: 415,
      code: "unsupported_media_type",
      extra: {
        accepted: accepted.map((
          k,
        ) => (k === "json" ? "application/json" : "application/octet-stream")),
      },
    },
  );
}

function tooLarge(limit: number, seen: number | string): ServiceError {
  return new ServiceError(`request body of ${seen} bytes exceeds the ${limit}-byte limit`, {
    status: 413,
    code: "body_too_large",
    extra: { max_body_bytes: limit },
  });
}

/**
 * Reads the whole body, refusing more than `limit` bytes: a declared Content-Length over the
 * limit fails before reading; otherwise bytes are counted as they stream in.
 */
export async function readBody(req: Request, limit: number): Promise<Uint8Array> {
  const cl = req.headers.get("content-length");
  if (cl !== null) {
    const n = Number(cl);
    if (!/^\d+$/.test(cl.trim())) {
      throw new ServiceError(`invalid Content-Length ${JSON.stringify(cl)}`, {
        status: 400,
        code: "bad_request",
      });
    }
    if (n > limit) throw tooLarge(limit, n);
  }
  if (!req.body) return new Uint8Array(0);
  const reader = req.body.getReader();
  // With a declared length, fill one exact buffer (no second copy of a large body).
  const declared = cl !== null ? Number(cl) : -1;
  let buf = new Uint8Array(declared >= 0 ? declared : 64 * 1024);
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (total + value.byteLength > limit) {
      await reader.cancel().catch(() => {});
      throw tooLarge(limit, `more than ${limit}`);
    }
    if (total + value.byteLength > buf.byteLength) {
      const grown = new Uint8Array(
        Math.min(limit, Math.max(buf.byteLength * 2, total + value.byteLength)),
      );
      grown.set(buf.subarray(0, total));
      buf = grown;
    }
    buf.set(value, total);
    total += value.byteLength;
  }
  return total === buf.byteLength ? buf : buf.subarray(0, total);
}

/** Parses a JSON body (400 `malformed_json` with the parser's message). */
export function parseJson(bytes: Uint8Array): unknown {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new ServiceError("request body is not valid UTF-8", {
      status: 400,
      code: "malformed_json",
    });
  }
  if (text.trim() === "") {
    throw new ServiceError("request body is empty; expected a JSON object", {
      status: 400,
      code: "malformed_json",
    });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ServiceError(
      `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`,
      {
        status: 400,
        code: "malformed_json",
      },
    );
  }
}

function quality(accept: string, type: string): { q: number; at: number } {
  const parts = accept.split(",");
  for (let i = 0; i < parts.length; i++) {
    const [mt, ...params] = parts[i].split(";").map((s) => s.trim().toLowerCase());
    if (mt !== type) continue;
    const qp = params.find((p) => p.startsWith("q="));
    const q = qp ? Number(qp.slice(2)) : 1;
    return { q: Number.isFinite(q) ? q : 0, at: i };
  }
  return { q: -1, at: Infinity };
}

/** True when `Accept` asks for application/octet-stream (safetensors) over JSON. */
export function wantsBinary(req: Request): boolean {
  const accept = req.headers.get("accept");
  if (!accept) return false;
  const bin = quality(accept, "application/octet-stream");
  if (bin.q <= 0) return false;
  const json = quality(accept, "application/json");
  return bin.q > json.q || (bin.q === json.q && bin.at < json.at);
}
