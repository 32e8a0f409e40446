/**
 * A plan's prefix (the cache write and the poisoning: gpu/plan_prefix.ts) is built once per
 * device and shape and replayed; its key now carries the context's cap on a cache chunk
 * (MAX_KV_CHUNK_BYTES, what the tests' multi-chunk caches set). Before, one shape planned on one
 * device first over a one-buffer cache, then over a chunked one, replayed the one-buffer prefix:
 * "binding k2 has no buffer" or NaN outputs (a numerics audit), so a test that mixed chunk layouts
 * on one device could check another kernel than it meant to. Each run against CPU_REFERENCE.
 * @module
 */
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { WEBGPU_DECODE } from "../../backends/webgpu_decode.ts";
import { WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { generateBatch, smallSpec } from "../support/batches.ts";
import { checkRun, runOn } from "../conformance/check.ts";
import { chunkedCtx, freshSeed, GPU, NO_GPU } from "./helpers.ts";

for (
  const [name, b] of [["WEBGPU_FLASH", WEBGPU_FLASH], ["WEBGPU_DECODE", WEBGPU_DECODE]] as const
) {
  Deno.test(`plan prefix: one shape, one device, three chunk layouts in turn: ${name}`, {
    ignore: NO_GPU,
  }, async () => {
    const g = generateBatch(
      smallSpec({ requests: [{ query_len: 1, seq_len: 30 }, { query_len: 5, seq_len: 12 }] }),
      freshSeed(),
    );
    const ref = await runOn(CPU_REFERENCE, g, { gpu: null });
    const blockBytes = g.key_cache.byteLength / g.cache_spec!.num_blocks;
    for (const blocks of [0, 2, 3, 0]) {
      const gpu = blocks === 0 ? GPU! : chunkedCtx(GPU!, blocks, blockBytes);
      const got = await runOn(b as AttentionBackend, g, { gpu });
      try {
        checkRun(g, got, ref);
      } catch (e) {
        throw new Error(`${blocks ? `${blocks} blocks a chunk` : "one buffer"}: ${e}`);
      }
    }
  });
}
