/**
 * decodeBinaryForward remembers `__metadata__.request` texts it validated: a repeated call
 * decodes to the same values from its own tensors, shares nothing a call could change, and a
 * bad request is refused with the same 400 every time, also after a good one like it.
 */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import { toFloat32 } from "../../core/data.ts";
import { decodeBinaryForward } from "../../wire/codec.ts";
import { forwardBodyToSafetensors } from "../../wire/client_codec.ts";
import type { ForwardBody } from "../../wire/types.ts";

function body(values: number[], layer: Record<string, unknown> = {}): ForwardBody {
  const t = (data: number[]) => ({ dtype: "float32", shape: [1, 2, 4], data });
  return {
    dtype: "float32",
    layer: { num_heads: 2, num_kv_heads: 2, head_size: 4, attn_type: "encoder_only", ...layer },
    query: t(values),
    key: t(values),
    value: t(values),
    metadata: { query_start_loc: [0, 1], seq_lens: [1] },
  } as ForwardBody;
}

const rand = () => Array.from({ length: 8 }, () => Math.fround(Math.random() * 2 - 1));

Deno.test("codec: a repeated request text decodes each call's own tensors; shared parts are frozen", () => {
  const a = rand(), b = rand();
  const first = decodeBinaryForward(forwardBodyToSafetensors(body(a))).input;
  const second = decodeBinaryForward(forwardBodyToSafetensors(body(b))).input;
  assert.deepEqual(Array.from(toFloat32(first.query.array)), a);
  assert.deepEqual(Array.from(toFloat32(second.query.array)), b);
  assert.deepEqual(second.layer, first.layer);
  assert.throws(() => (second.layer as { num_heads: number }).num_heads = 3, TypeError);
  assert.equal(first.layer.num_heads, 2);
});

Deno.test("codec: a bad request text is the same 400 every time, also after a good one", () => {
  decodeBinaryForward(forwardBodyToSafetensors(body(rand())));
  for (let i = 0; i < 3; i++) {
    assert.throws(
      () => decodeBinaryForward(forwardBodyToSafetensors(body(rand(), { num_heads: -2 }))),
      (e: unknown) => {
        assert.ok(e instanceof ServiceError);
        assert.equal(e.status, 400);
        assert.equal(e.code, "invalid_request");
        const issue = e.issues!.find((x) => x.path.join(".").endsWith("layer.num_heads"));
        assert.ok(issue, JSON.stringify(e.issues));
        assert.deepEqual(issue.path, ["__metadata__", "request", "layer", "num_heads"]);
        assert.match(e.message, /-2/);
        return true;
      },
    );
  }
});
