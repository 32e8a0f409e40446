/**
 * Media types as both sides read them: the server choosing a body's kind (server/body.ts), the
 * client choosing how to decode an answer (client/client.ts).
 * @module
 */

/** The media type of a Content-Type value: before any parameter, trimmed, lower case. */
export function mediaType(header: string | null): string {
  return (header ?? "").split(";")[0].trim().toLowerCase();
}

/** JSON-ish media types: application/json and any `+json` suffix. */
export function isJsonType(mt: string): boolean {
  return mt === "application/json" || (mt.startsWith("application/") && mt.endsWith("+json"));
}
