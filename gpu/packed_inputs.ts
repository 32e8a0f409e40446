/**
 * Query, key and value as one upload where a request body carried them back to back
 * ({@link packedInputs}); gpu/plan_bind.ts binds them as ranges of one pooled buffer.
 * @module
 */
import type { ValidBatch } from "../core/types.ts";
import { sizeClass } from "./buffer_pool.ts";

/** The data tensors, in the order a request body carries them. */
export const INPUTS = ["query", "key", "value"] as const;

/** Query/key/value as one span of the memory they came in, and where each lies in it. */
export interface PackedInputs {
  span: Uint8Array;
  /** Per tensor present: its byte offset in `span` and its bytes. */
  at: { name: (typeof INPUTS)[number]; offset: number; bytes: number }[];
}

/**
 * Query/key/value as one upload where the request carried them back to back in one body (a
 * safetensors body from this project's client: the tensors follow one another): at least two
 * present, in order, in one ArrayBuffer, each starting a multiple of `align` bytes (the device's
 * storage offset alignment) after the first, each a whole (non-zero) number of words (a range
 * binding is exactly its tensor, where a separate buffer is a pooled size class), gaps smaller
 * than `align`, the pooled buffer of the span at most `maxBytes`. Null otherwise: each goes up in a
 * write of its own.
 */
export function packedInputs(
  b: Pick<ValidBatch, "query" | "key" | "value">,
  align: number,
  maxBytes: number,
): PackedInputs | null {
  const first = b.query.bytes;
  let end = first.byteOffset;
  const at: PackedInputs["at"] = [];
  for (const name of INPUTS) {
    const t = b[name]?.bytes;
    if (!t) continue;
    const offset = t.byteOffset - first.byteOffset;
    if (
      t.buffer !== first.buffer || t.byteOffset < end || t.byteOffset - end >= align ||
      offset % align !== 0 || t.byteLength % 4 !== 0 || t.byteLength === 0
    ) return null;
    at.push({ name, offset, bytes: t.byteLength });
    end = t.byteOffset + t.byteLength;
  }
  if (at.length < 2 || sizeClass(end - first.byteOffset) > maxBytes) return null;
  return { span: new Uint8Array(first.buffer, first.byteOffset, end - first.byteOffset), at };
}
