/**
 * Request bodies: media types (JSON or safetensors, else 415), the size limits (Content-Length
 * checked before reading, bytes counted while streaming so chunked bodies are capped too: 413;
 * JSON bodies have their own, lower limit), a body cut short by the client (400
 * `body_incomplete`), JSON parsing within bounds (400; see json_scan.ts), and `Accept`
 * negotiation between JSON and safetensors responses.
 * @module
 */
import type { z } from "zod";
import { ServiceError } from "../core/errors.ts";
import { scanJson } from "../wire/json_scan.ts";
import { fromZod } from "../wire/zod_issues.ts";

/** Default body limit (safetensors bodies): 512 MiB. */
export const DEFAULT_MAX_BODY_BYTES = 512 * 1024 * 1024;

/**
 * Default limit of JSON bodies: 64 MiB (room for ~3 M random floats as text). Parsing JSON
 * costs far more memory and time per byte than safetensors; json_scan.ts also caps the number
 * of values, which is what drives that cost.
 */
export const DEFAULT_MAX_JSON_BODY_BYTES = 64 * 1024 * 1024;

/**
 * Largest value `--max-json-body-bytes` accepts: 256 MiB, under V8's largest string (2^29
 * UTF-16 units) that the parse needs.
 */
export const MAX_JSON_BODY_BYTES_CEILING = 256 * 1024 * 1024;

/** First buffer of a body read: never more than this before bytes actually arrive. */
const INITIAL_BODY_BUFFER = 1024 * 1024;

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

/** A body size limit and the flag that sets it (named in the 413). */
export interface BodyLimit {
  bytes: number;
  /** The problem field naming the limit, e.g. `max_body_bytes`. */
  field: string;
  /** What kind of body it applies to, for the message (e.g. "JSON "). */
  kind?: string;
}

function tooLarge(limit: BodyLimit, seen: number | string): ServiceError {
  return new ServiceError(
    `${limit.kind ?? ""}request body of ${seen} bytes exceeds the ${limit.bytes}-byte limit`,
    { status: 413, code: "body_too_large", extra: { [limit.field]: limit.bytes } },
  );
}

function incomplete(got: number, declared: number, cause: unknown): ServiceError {
  const of = declared >= 0 ? ` of the ${declared} declared` : "";
  const why = cause instanceof Error ? `: ${cause.message}` : "";
  return new ServiceError(
    `request body ended after ${got}${of} bytes: the client stopped sending${why}`,
    { status: 400, code: "body_incomplete", extra: { received_bytes: got } },
  );
}

/**
 * Reads the whole body, refusing more than `limit` bytes: a declared Content-Length over the
 * limit fails before reading; otherwise bytes are counted as they stream in. Memory follows
 * the bytes received (a declared length reserves nothing up front). A body the client stops
 * sending is a 400 `body_incomplete`.
 */
export async function readBody(req: Request, limit: number | BodyLimit): Promise<Uint8Array> {
  const lim: BodyLimit = typeof limit === "number"
    ? { bytes: limit, field: "max_body_bytes" }
    : limit;
  const cl = req.headers.get("content-length");
  let declared = -1;
  if (cl !== null) {
    if (!/^\d+$/.test(cl.trim())) {
      throw new ServiceError(`invalid Content-Length ${JSON.stringify(cl)}`, {
        status: 400,
        code: "bad_request",
      });
    }
    declared = Number(cl);
    if (declared > lim.bytes) throw tooLarge(lim, declared);
  }
  if (!req.body) return new Uint8Array(0);
  const reader = req.body.getReader();
  const cap = declared >= 0 ? declared : lim.bytes;
  let buf = new Uint8Array(Math.min(cap, INITIAL_BODY_BUFFER));
  let total = 0;
  // With a declared length, stop at it: a client that half-closes after its last byte makes
  // one more read fail though the body is whole.
  while (declared < 0 || total < declared) {
    let chunk: ReadableStreamReadResult<Uint8Array>;
    try {
      chunk = await reader.read();
    } catch (e) {
      throw incomplete(total, declared, e);
    }
    if (chunk.done) break;
    const value = chunk.value;
    if (total + value.byteLength > lim.bytes) {
      await reader.cancel().catch(() => {});
      throw tooLarge(lim, `more than ${lim.bytes}`);
    }
    if (total + value.byteLength > buf.byteLength) {
      const want = Math.max(buf.byteLength * 2, total + value.byteLength);
      const grown = new Uint8Array(Math.min(Math.max(cap, total + value.byteLength), want));
      grown.set(buf.subarray(0, total));
      buf = grown;
    }
    buf.set(value, total);
    total += value.byteLength;
  }
  if (declared >= 0 && total < declared) throw incomplete(total, declared, undefined);
  reader.releaseLock();
  return total === buf.byteLength ? buf : buf.subarray(0, total);
}

/**
 * Parses a JSON body (400 `malformed_json` with the parser's message) after the depth and size
 * pre-scan of {@link scanJson} (400 `json_too_deep`, 413 `json_too_many_values`).
 */
export function parseJson(bytes: Uint8Array): unknown {
  scanJson(bytes);
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

/** The size limit of each body kind: JSON's own, capped by the general one. */
export type BodyLimits = Record<BodyKind, BodyLimit>;

/** The limits of each body kind from the two flags (JSON's never above the general one). */
export function bodyLimits(maxBodyBytes?: number, maxJsonBodyBytes?: number): BodyLimits {
  const binary = { bytes: maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES, field: "max_body_bytes" };
  const json = maxJsonBodyBytes ?? DEFAULT_MAX_JSON_BODY_BYTES;
  return {
    binary,
    json: json < binary.bytes
      ? { bytes: json, field: "max_json_body_bytes", kind: "JSON " }
      : { ...binary, kind: "JSON " },
  };
}

/** A JSON body (415 for another type, 413 over the limit) validated by a wire schema (400). */
export async function jsonBody<T>(
  req: Request,
  limits: BodyLimits,
  schema: z.ZodType<T>,
): Promise<T> {
  bodyKind(req, ["json"]);
  const body = parseJson(await readBody(req, limits.json));
  const r = schema.safeParse(body);
  if (!r.success) throw fromZod(r.error, body);
  return r.data;
}
