/**
 * The switches of WEBGPU_FLASH's defaults (backends/webgpu_flash.ts `resolveFlashOptions`):
 * `ATTN_PREFILL_MMA` (`FlashOptions.mma`) and `ATTN_PREFILL_SPLIT`
 * (`FlashOptions.prefill_split`), each `0` (off) or `1` (on), unset or empty on. Their rules
 * live here, apart from the backend, so that server/serve_env.ts can check them without loading
 * the registered backend, which reads them as it loads.
 * @module
 */
import { type EnvSetting, switchSetting } from "../core/env.ts";

/** `ATTN_PREFILL_MMA`: `FlashOptions.mma`'s default. */
export const PREFILL_MMA_SETTING: EnvSetting<boolean> = switchSetting("ATTN_PREFILL_MMA", true);

/** `ATTN_PREFILL_SPLIT`: `FlashOptions.prefill_split`'s default. */
export const PREFILL_SPLIT_SETTING: EnvSetting<boolean> = switchSetting("ATTN_PREFILL_SPLIT", true);
