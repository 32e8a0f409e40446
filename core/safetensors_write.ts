/**
 * Writing a safetensors file: the length-prefixed JSON header padded so the data starts
 * aligned, then each tensor's bytes; as parts a response can stream ({@link safetensorsParts}),
 * the header alone with the data's length ({@link safetensorsHead}), or one array
 * ({@link serializeSafetensors}, {@link concatBytes}).
 * @module
 */
import { ServiceError } from "./errors.ts";
import {
  numel,
  SAFETENSORS_DTYPE_BYTES,
  type SafetensorsTensor,
  show,
} from "./safetensors_format.ts";

/**
 * A safetensors file as parts: the length-prefixed header (padded with spaces to a multiple
 * of 8 bytes so the data starts aligned), then each tensor's bytes as given (not copied), in
 * order. Their concatenation is the file; a response can stream them as they are.
 * @throws ServiceError 500 `bad_tensor` when a tensor's byte length disagrees with dtype x shape.
 */
export function safetensorsParts(
  tensors: Record<string, SafetensorsTensor>,
  metadata?: Record<string, string>,
): Uint8Array[] {
  for (const [name, t] of Object.entries(tensors)) {
    const want = numel(t.shape) * SAFETENSORS_DTYPE_BYTES[t.dtype];
    if (t.data.byteLength !== want) {
      throw new ServiceError(
        `tensor ${name}: ${t.data.byteLength} bytes but ${t.dtype} x ${
          show(t.shape)
        } needs ${want}`,
        { status: 500, code: "bad_tensor" },
      );
    }
  }
  const { head } = safetensorsHead(tensors, metadata);
  return [head, ...Object.values(tensors).map((t) => t.data)];
}

/**
 * The first part of {@link safetensorsParts} for tensors of these dtypes and shapes (no data
 * needed), and the bytes of data after it: a file's length without its contents (a HEAD).
 */
export function safetensorsHead(
  tensors: Record<string, Pick<SafetensorsTensor, "dtype" | "shape">>,
  metadata?: Record<string, string>,
): { head: Uint8Array; data_bytes: number } {
  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    const want = numel(t.shape) * SAFETENSORS_DTYPE_BYTES[t.dtype];
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + want] };
    offset += want;
  }
  const json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.byteLength / 8) * 8;
  const head = new Uint8Array(8 + padded).fill(0x20);
  new DataView(head.buffer).setBigUint64(0, BigInt(padded), true);
  head.set(json, 8);
  return { head, data_bytes: offset };
}

/**
 * Serializes tensors (in the given order) and optional metadata as one safetensors file
 * (the concatenation of {@link safetensorsParts}).
 * @throws ServiceError 500 `bad_tensor` when a tensor's byte length disagrees with dtype x shape.
 */
export function serializeSafetensors(
  tensors: Record<string, SafetensorsTensor>,
  metadata?: Record<string, string>,
): Uint8Array {
  return concatBytes(safetensorsParts(tensors, metadata));
}

/** The parts one after another in one new array. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}
