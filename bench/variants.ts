/**
 * Kernel variants a bench run sweeps beside the registered backends: WEBGPU_FLASH with other
 * prefill tiles (`--flash-tiles 8x8x4x4,8x8x4x2` or `BENCH_FLASH_TILES`) and WEBGPU_DECODE with
 * other tunings (`--decode-tunings '[{"keys_per_iter":8},{"prefetch":true}]'` or
 * `BENCH_DECODE_TUNINGS`: a JSON array of partial DecodeTuning objects over the defaults).
 * Each variant is a whole backend built by the same factory the registry's entry comes from,
 * so a variant runs exactly the code a tuned deployment would.
 * @module
 */
import type { AttentionBackend, GpuContext } from "../core/types.ts";
import { flashTileUnfit, parseFlashTile } from "../backends/flash_plan.ts";
import { makeWebGpuFlash } from "../backends/webgpu_flash.ts";
import { makeWebGpuDecode } from "../backends/webgpu_decode.ts";
import {
  type DecodeTuning,
  decodeTuningProblem,
  DEFAULT_DECODE_TUNING,
  envDecodeTuning,
} from "../backends/webgpu_decode_tuning.ts";
import type { BenchShape } from "./shapes.ts";

/** One swept variant. */
export interface Variant {
  /** e.g. `WEBGPU_FLASH[8x8x4x4]`. */
  label: string;
  backend: AttentionBackend;
  /** The shapes it runs on (and `also` these: a decode tuning's WEBGPU_DECODE takes prefill
   * rows as split-KV rows too). */
  kind: BenchShape["kind"];
  also?: BenchShape["kind"];
  /** Why it cannot run head size `d` here, or null. */
  unfit(gpu: GpuContext, d: number): string | null;
}

/** The prefill tile variants named in `text` (comma-separated `TXxTYxRMxRN`). */
export function flashVariants(text: string | undefined): Variant[] {
  if (!text) return [];
  return text.split(",").map((x) => x.trim()).filter((x) => x).map((x) => {
    const tile = parseFlashTile(x);
    return {
      label: `WEBGPU_FLASH[${x}]`,
      // The portable kernel with this tile, also where the tensor-core kernel or the split-KV
      // kernels would take the prefill rows.
      backend: makeWebGpuFlash({
        tile,
        decode: envDecodeTuning(),
        mma: false,
        prefill_split: false,
      }) as AttentionBackend,
      kind: "prefill" as const,
      unfit: (gpu: GpuContext, d: number) => flashTileUnfit(d, tile, gpu.limits, Infinity),
    };
  });
}

/**
 * The decode tuning variants of `text` (a JSON array of partial tunings).
 * @throws Error naming a variant with an unknown field, a value of the wrong type, or a number
 *   that breaks its rule (`decodeTuningProblem`: what `ATTN_DECODE_TUNING` refuses too).
 */
export function decodeVariants(text: string | undefined): Variant[] {
  if (!text) return [];
  const list = JSON.parse(text);
  if (!Array.isArray(list)) throw new Error(`decode tunings: expected a JSON array, got ${text}`);
  return list.map((o: Record<string, unknown>) => {
    const t: DecodeTuning = { ...DEFAULT_DECODE_TUNING };
    for (const [k, v] of Object.entries(o)) {
      const cur = (t as unknown as Record<string, unknown>)[k];
      if (cur === undefined || typeof cur !== typeof v) {
        throw new Error(`decode tunings: unknown field or wrong type: ${k} = ${JSON.stringify(v)}`);
      }
      (t as unknown as Record<string, unknown>)[k] = v;
    }
    const problem = decodeTuningProblem(t);
    if (problem !== null) throw new Error(`decode tunings: ${JSON.stringify(o)}: ${problem}`);
    return {
      label: `WEBGPU_DECODE${JSON.stringify(o)}`,
      backend: makeWebGpuDecode(t) as AttentionBackend,
      kind: "decode" as const,
      also: "prefill" as const,
      unfit: () => null,
    };
  });
}
