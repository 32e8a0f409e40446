/**
 * The forward route frees a safetensors body's memory once the call is answered
 * (server/forward_routes.ts releaseBody): the tensors the service saw were views into the body,
 * and after the answer their buffer is detached. A prefill and two decode steps on a held cache,
 * each sent after the one before had its body released, still match float64: what the cache
 * kept of the earlier steps' K/V was copied, not a view into a released body.
 */
import assert from "node:assert/strict";
import type { ForwardInput } from "../../wire/codec.ts";
import { releaseBody } from "../../server/forward_routes.ts";
import { maxAbsDiff, startServer } from "./helpers.ts";
import { F32_CACHE, Seqs } from "./seqs.ts";

Deno.test("forward over HTTP: a safetensors body's memory is released once answered", async () => {
  const srv = await startServer();
  const seen: ForwardInput[] = [];
  const forward = srv.service.forward.bind(srv.service);
  srv.service.forward = (input, opts) => {
    seen.push(input);
    return forward(input, opts);
  };
  try {
    const info = await srv.client.createCache(F32_CACHE);
    const seqs = new Seqs(Math.fround);
    for (const lens of [[3, 2], [1, 1], [1, 1]]) {
      const { body, refOut } = seqs.step(lens, "float32");
      const ans = await srv.client.forward({ ...body, kv_cache: info.id }, { binary: true });
      const err = maxAbsDiff(ans.output.values, refOut);
      assert.ok(err < 2e-5, `${lens}: output max abs err ${err}`);
      const q = seen.at(-1)!.query.array.bytes;
      assert.equal(q.buffer.byteLength, 0, `${lens}: the body's buffer was not released`);
      assert.equal(q.byteLength, 0);
    }
    assert.equal(seen.length, 3);
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("releaseBody: detaches once, leaves a detached or empty buffer alone", () => {
  const bytes = new Uint8Array(64).fill(7);
  const view = bytes.subarray(8, 16);
  releaseBody(bytes);
  assert.equal(bytes.buffer.byteLength, 0);
  assert.equal(view.byteLength, 0);
  releaseBody(bytes); // already detached: no throw
  releaseBody(new Uint8Array(0));
  const moved = new Uint8Array(16);
  structuredClone(moved.buffer, { transfer: [moved.buffer] });
  releaseBody(moved);
});
