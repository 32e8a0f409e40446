/**
 * The backends this service ships, in no particular order (the registry sorts by priority).
 * @module
 */
import type { AttentionBackend } from "../core/types.ts";
import { CPU_REFERENCE } from "./cpu/cpu_reference.ts";
import { WEBGPU_DECODE } from "./webgpu_decode.ts";
import { WEBGPU_FLASH } from "./webgpu_flash.ts";

/** Every built-in backend descriptor. */
export function builtinBackends(): AttentionBackend[] {
  return [
    CPU_REFERENCE as AttentionBackend,
    WEBGPU_FLASH as AttentionBackend,
    WEBGPU_DECODE as AttentionBackend,
  ];
}
