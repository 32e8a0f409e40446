import assert from "node:assert/strict";
import { stubService } from "../../bench/http_overhead_server.ts";
import type { ForwardInput } from "../../wire/codec.ts";

/** A decode-shaped input: the stub reads only the query's shape, dtype and bytes. */
function input(tokens: number): ForwardInput {
  const bytes = new Uint8Array(tokens * 4 * 8 * 2);
  return {
    query: { dtype: "float16", shape: [tokens, 4, 8], array: { bytes } },
  } as unknown as ForwardInput;
}

Deno.test("stub service: answers the query's size at once, or after its busy wait", async () => {
  for (const delayMs of [0, 5]) {
    const stub = stubService(delayMs);
    const t0 = performance.now();
    const out = await stub.forward(input(3));
    const ms = performance.now() - t0;
    assert.deepEqual([out.num_tokens, out.num_heads, out.head_size], [3, 4, 8]);
    assert.equal(out.result.output.bytes.byteLength, 3 * 4 * 8 * 2);
    if (delayMs > 0) assert.ok(ms >= delayMs, `answered after ${ms} ms, before its ${delayMs} ms`);
  }
});
