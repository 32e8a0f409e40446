/**
 * A safetensors forward body from this project's client carries query, key and value back to
 * back, and the server's decoding keeps them as views of the body: the validated batch's three
 * tensors then go up to the GPU in one write (gpu/plan_bind.ts `packedInputs`). A JSON body's
 * tensors are separate arrays, each written on its own.
 */
import assert from "node:assert/strict";
import { decodeBinaryForward, decodeJsonForward } from "../../wire/codec.ts";
import { forwardBodyToSafetensors } from "../../wire/client_codec.ts";
import type { ForwardBody } from "../../wire/types.ts";
import { validateForward } from "../../service/validate.ts";
import { packedInputs } from "../../gpu/plan_bind.ts";

/** An encoder-only call of `tokens` tokens, 2 heads of 64 f16 elements: 256 B a token. */
function body(tokens: number): ForwardBody {
  const t = () => ({
    dtype: "float16",
    shape: [tokens, 2, 64],
    data: Array.from({ length: tokens * 128 }, () => Math.round(Math.random() * 64 - 32) / 32),
  });
  return {
    dtype: "float16",
    layer: { num_heads: 2, num_kv_heads: 2, head_size: 64, attn_type: "encoder_only" },
    query: t(),
    key: t(),
    value: t(),
    metadata: { query_start_loc: [0, tokens], seq_lens: [tokens] },
  } as ForwardBody;
}

Deno.test("packed body: a safetensors body's q/k/v validate to one span of the body", () => {
  for (const tokens of [1, 3]) {
    const bytes = forwardBodyToSafetensors(body(tokens));
    const v = validateForward(decodeBinaryForward(bytes).input, null);
    const packed = packedInputs(v.batch, 256, 2 ** 28);
    const n = 256 * tokens;
    assert.deepEqual(packed?.at, [
      { name: "query", offset: 0, bytes: n },
      { name: "key", offset: n, bytes: n },
      { name: "value", offset: 2 * n, bytes: n },
    ]);
    assert.equal(packed!.span.buffer, bytes.buffer, "a view of the body, not a copy");
  }
});

Deno.test("packed body: a JSON body's q/k/v stay three writes", () => {
  const v = validateForward(decodeJsonForward(JSON.parse(JSON.stringify(body(2)))).input, null);
  assert.equal(packedInputs(v.batch, 256, 2 ** 28), null);
});
