/**
 * Element access of the host KV cache (backends/cpu/host_cache.ts): a codec per storage dtype
 * ({@link codecFor}) reads element i of a buffer as its real value and writes element i from a
 * value, rounded with core/dtype.ts (nearest even; fp8 saturates), through typed views made
 * once over the bytes, so a read or write costs no allocation.
 * @module
 */
import {
  bytesPerElement,
  f32ToBf16Bits,
  f32ToFp8E4m3,
  f32ToFp8E5m2,
  FP8_E4M3_TABLE,
  FP8_E5M2_TABLE,
} from "../../core/dtype.ts";
import type { StorageDType } from "../../core/types.ts";

/** Reads element i of a buffer as its real value; writes element i from a value (rounded). */
export interface ElementCodec {
  get(i: number): number;
  set(i: number, x: number): void;
}

/** The codec of storage dtype `d` over `bytes`: its typed views are made here, once. */
export function codecFor(d: StorageDType, bytes: Uint8Array): ElementCodec {
  const buf = bytes.buffer, n = bytes.byteLength / bytesPerElement(d);
  switch (d) {
    case "float32": {
      const a = new Float32Array(buf, bytes.byteOffset, n);
      return { get: (i) => a[i], set: (i, x) => void (a[i] = x) };
    }
    case "float16": {
      const a = new Float16Array(buf, bytes.byteOffset, n);
      return { get: (i) => a[i], set: (i, x) => void (a[i] = x) };
    }
    case "bfloat16": {
      const a = new Uint16Array(buf, bytes.byteOffset, n);
      const w = new Float32Array(1), wb = new Uint32Array(w.buffer);
      return {
        get: (i) => {
          wb[0] = a[i] << 16;
          return w[0];
        },
        set: (i, x) => void (a[i] = f32ToBf16Bits(x)),
      };
    }
    case "fp8_e4m3":
      return {
        get: (i) => FP8_E4M3_TABLE[bytes[i]],
        set: (i, x) => void (bytes[i] = f32ToFp8E4m3(x)),
      };
    case "fp8_e5m2":
      return {
        get: (i) => FP8_E5M2_TABLE[bytes[i]],
        set: (i, x) => void (bytes[i] = f32ToFp8E5m2(x)),
      };
  }
}
