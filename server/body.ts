/**
 * Request bodies: media types (JSON or safetensors, else 415), the size limits of each kind
 * (JSON bodies have their own, lower limit; reading within them is body_read.ts), JSON
 * parsing within bounds (400; see json_scan.ts), and `Accept` negotiation between JSON and
 * safetensors responses.
 * @module
 */
import type { z } from "zod";
import { ServiceError } from "../core/errors.ts";
import { scanJson } from "../wire/json_scan.ts";
import { jsonPath, REPEATED_NAME } from "../core/json_structure.ts";
import { fromZod } from "../wire/zod_issues.ts";
import { rememberJsonText } from "../wire/json_literals.ts";
import { type BodyLimit, readBody } from "./body_read.ts";
import { problem } from "./problem.ts";
import { isJsonType, mediaType } from "../wire/media_type.ts";

export { isJsonType, mediaType };

export { type BodyLimit, readBody } from "./body_read.ts";

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

/** The body kinds a route may take. */
export type BodyKind = "json" | "binary";

/**
 * Refuses a body in any content coding but `identity` (RFC 9110 15.5.16: 415 with
 * `Accept-Encoding`): the service reads bodies as sent, and a compressed one would otherwise be
 * misread as bad JSON or safetensors.
 */
function checkContentEncoding(req: Request): void {
  const raw = req.headers.get("content-encoding");
  if (raw === null) return;
  const codings = raw.split(",").map((c) => c.trim().toLowerCase()).filter((c) => c !== "");
  const other = codings.filter((c) => c !== "identity");
  if (other.length === 0) return;
  throw problem(
    415,
    "unsupported_content_encoding",
    `unsupported Content-Encoding ${JSON.stringify(raw)}; send the body uncompressed ` +
      "(no Content-Encoding, or identity)",
    { content_encoding: raw, accepted_encodings: ["identity"] },
    { headers: { "accept-encoding": "identity" } },
  );
}

/** A header value for a message or a problem field: past 200 characters cut with `...`. */
function shownHeader(value: string): string {
  return value.length > 200 ? `${value.slice(0, 200)}...` : value;
}

/**
 * Refuses a JSON body whose Content-Type names a `charset` other than `utf-8` (any case, quoted
 * or not): JSON is UTF-8 only (RFC 8259 8.1), and such a body would be read and then refused as
 * a 400 `malformed_json` (not UTF-8), or read as UTF-8 against what the client said.
 */
function checkJsonCharset(header: string, accepted: BodyKind[]): void {
  for (const param of header.split(";").slice(1)) {
    const eq = param.indexOf("=");
    if (eq < 0 || param.slice(0, eq).trim().toLowerCase() !== "charset") continue;
    let value = param.slice(eq + 1).trim();
    if (value.length >= 2 && value.startsWith('"') && value.endsWith('"')) {
      value = value.slice(1, -1).replace(/\\(.)/g, "$1");
    }
    if (value.toLowerCase() === "utf-8") continue;
    const shown = shownHeader(value);
    throw new ServiceError(
      `unsupported charset ${JSON.stringify(shown)} in Content-Type ${
        JSON.stringify(shownHeader(header))
      }; JSON bodies are UTF-8 (RFC 8259): send charset=utf-8 or no charset`,
      {
        status: 415,
        code: "unsupported_media_type",
        extra: {
          content_type: shownHeader(header),
          charset: shown,
          accepted_charsets: ["utf-8"],
          accepted: accepted.map((
            k,
          ) => (k === "json" ? "application/json" : "application/octet-stream")),
        },
      },
    );
  }
}

/**
 * Which body kind a request carries: 415 when it is none of `accepted`, when it comes in a
 * content coding ({@link checkContentEncoding}), or when it is JSON in a charset other than
 * UTF-8 ({@link checkJsonCharset}).
 */
export function bodyKind(req: Request, accepted: BodyKind[]): BodyKind {
  checkContentEncoding(req);
  const header = req.headers.get("content-type");
  const mt = mediaType(header);
  if (isJsonType(mt) && accepted.includes("json")) {
    checkJsonCharset(header!, accepted);
    return "json";
  }
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

/**
 * Parses a JSON body (400 `malformed_json` with the parser's message) after the depth and size
 * pre-scan of {@link scanJson} (400 `json_too_deep`, 413 `json_too_many_values`).
 */
export function parseJson(bytes: Uint8Array): unknown {
  const twice = scanJson(bytes);
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
  let json: unknown;
  try {
    json = rememberJsonText(JSON.parse(text), text);
  } catch (e) {
    throw new ServiceError(
      `request body is not valid JSON: ${e instanceof Error ? e.message : String(e)}`,
      {
        status: 400,
        code: "malformed_json",
      },
    );
  }
  if (twice) {
    const where = jsonPath(twice.path);
    throw new ServiceError(`request body: ${where} ${REPEATED_NAME}`, {
      status: 400,
      code: "malformed_json",
      issues: [{ path: twice.path, message: REPEATED_NAME }],
    });
  }
  return json;
}

/** The answers the forward routes can give, by media type. */
export const ANSWER_TYPES = {
  json: "application/json",
  binary: "application/octet-stream",
} as const;

/**
 * The weight `accept` gives `type` (RFC 9110 12.5.1): the most specific media range that
 * matches it (`type/sub`, then `type/*`, then the wildcard of every type) decides; its position
 * breaks ties between types of equal weight and specificity. Read leniently, as clients send it: a
 * bare `*` is the wildcard (Java's default header has one), a `q` is any number from 0 to 1
 * (`.2`, `0.5000`); a member that still does not parse (no type, a `q` out of range) is skipped.
 * `parsed` says whether any member parsed (none: the header is taken as absent).
 */
function weight(
  accept: string,
  type: string,
): { q: number; specificity: number; at: number; parsed: boolean } {
  const [main] = type.split("/");
  let best = { q: 0, specificity: -1, at: Infinity };
  let parsed = false;
  const members = accept.split(",");
  for (let i = 0; i < members.length; i++) {
    const [first, ...params] = members[i].split(";").map((s) => s.trim().toLowerCase());
    const range = first === "*" ? "*/*" : first;
    const slash = range.indexOf("/");
    if (slash <= 0 || slash === range.length - 1) continue;
    const qp = params.find((p) => /^q\s*=/.test(p));
    const qs = qp ? qp.slice(qp.indexOf("=") + 1).trim() : "1";
    const q = qs === "" ? NaN : Number(qs);
    if (!(q >= 0 && q <= 1)) continue; // NaN too
    parsed = true;
    const specificity = range === type ? 2 : range === `${main}/*` ? 1 : range === "*/*" ? 0 : -1;
    if (specificity > best.specificity) best = { q, specificity, at: i };
  }
  return { ...best, parsed };
}

/**
 * Which answer a forward call gets from its `Accept` header: safetensors where it weighs
 * application/octet-stream above application/json (or equally, by a more specific or an earlier
 * range), else JSON (no header, an empty one, one where no member parses, the wildcard of every
 * type, `application/*`).
 * @throws ServiceError 406 `not_acceptable` (`accept`, `available`) when it accepts neither:
 *   checked before the body is read, so nothing ran and nothing was written.
 */
export function answerKind(req: Request): "json" | "binary" {
  const accept = req.headers.get("accept");
  if (accept === null || accept.trim() === "") return "json";
  const json = weight(accept, ANSWER_TYPES.json);
  const bin = weight(accept, ANSWER_TYPES.binary);
  if (!json.parsed) return "json"; // nothing in it parses: as if absent
  if (json.q <= 0 && bin.q <= 0) {
    const shown = accept.length > 200 ? `${accept.slice(0, 200)}...` : accept;
    throw new ServiceError(
      `Accept ${JSON.stringify(shown)} accepts neither application/json nor ` +
        "application/octet-stream (safetensors), the two answers of this endpoint; nothing ran",
      {
        status: 406,
        code: "not_acceptable",
        extra: { accept: shown, available: Object.values(ANSWER_TYPES) },
      },
    );
  }
  const binFirst = bin.q > json.q ||
    (bin.q === json.q &&
      (bin.specificity > json.specificity ||
        (bin.specificity === json.specificity && bin.at < json.at)));
  return binFirst ? "binary" : "json";
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
