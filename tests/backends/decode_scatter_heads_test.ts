/**
 * The scatter knobs (`scatter_sums`, `scatter_softmax`, `indexed_gather`) need a power-of-two
 * count of values a key group reduces (its heads x keys a step); a GQA group of 3, or 3 kv heads
 * a group, generated WGSL with `undefined` and fractional shifts that did not compile. Such
 * shapes now take the plain sums, and match CPU_REFERENCE.
 */
import { DEFAULT_DECODE_TUNING, makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { smallSpec } from "../support/batches.ts";
import { checkBackend } from "../support/backend_check.ts";
import { GPU, NO_GPU } from "../gpu/helpers.ts";

const ROWS = [{ query_len: 1, seq_len: 40 }, { query_len: 1, seq_len: 7 }];
const CASES: [string, Record<string, unknown>, number, number][] = [
  ["scatter_sums, GQA 3", { scatter_sums: true }, 3, 1],
  ["scatter_softmax, GQA 3", { scatter_softmax: true }, 3, 1],
  [
    "scatter_softmax + indexed_gather + half_columns, GQA 6",
    {
      scatter_softmax: true,
      indexed_gather: true,
      half_columns: true,
    },
    6,
    1,
  ],
  ["scatter_sums, 3 kv heads a group", { scatter_sums: true, kv_heads_per_group: 3 }, 3, 3],
];

for (const [name, knobs, heads, kvHeads] of CASES) {
  Deno.test(`decode scatter knobs, heads not a power of two: ${name}`, {
    ignore: NO_GPU,
  }, async () => {
    const backend = makeWebGpuDecode({ ...DEFAULT_DECODE_TUNING, ...knobs }) as AttentionBackend;
    await checkBackend(
      backend,
      GPU!,
      smallSpec({
        dtype: "float32",
        num_heads: heads,
        num_kv_heads: kvHeads,
        requests: ROWS,
      }),
    );
  });
}
