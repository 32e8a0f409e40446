/**
 * Safetensors files built by hand, independent of the service's serializer: for tests that feed
 * the parser well-formed and malformed files alike.
 * @module
 */

/** A file from a header (an object, or JSON text as is), a data section, and optionally a header length that lies. */
export function handSafetensors(header: unknown, data: Uint8Array, headerLen?: bigint): Uint8Array {
  const json = new TextEncoder().encode(
    typeof header === "string" ? header : JSON.stringify(header),
  );
  const out = new Uint8Array(8 + json.length + data.length);
  new DataView(out.buffer).setBigUint64(0, headerLen ?? BigInt(json.length), true);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}
