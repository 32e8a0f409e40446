/**
 * `PUT /v1/kv-caches/{id}` on a held id, two answers a black-box audit found wrong:
 * - an unknown forced `backend` was a 409 `cache_conflict` naming it (404 `unknown_backend` on
 *   a fresh id, for the same body); now 404 either way, and nothing changes;
 * - a `kv_cache_dtype` that differs as stored (`auto` over bfloat16 against `auto` over float16)
 *   read `is "auto" but cache ... has "auto"`; now each side says what it stores, and the issues
 *   come in the order docs/api.md lists the fields.
 * @module
 */
import assert from "node:assert/strict";
import { expectProblem, startServer } from "./helpers.ts";

const SPEC = {
  num_blocks: 2,
  block_size: 16,
  num_kv_heads: 1,
  head_size: 8,
  dtype: "float16",
} as const;

Deno.test("PUT a held id: an unknown backend is a 404, as on a fresh id", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("held", SPEC);
    const before = await srv.client.getCache("held");
    for (const id of ["held", "fresh"]) {
      for (const backend of ["NOPE", "cpu_reference"]) {
        const e = await expectProblem(
          srv.client.putCache(id, { ...SPEC, backend }),
          404,
          "unknown_backend",
          ["backend"],
        );
        assert.equal(e.problem.backend, backend);
      }
    }
    assert.deepEqual(await srv.client.getCache("held"), before, "nothing changed");
    assert.equal(srv.service.caches.peek("fresh"), undefined, "nothing made");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("PUT a held id: kv_cache_dtype shown as stored, issues in the documented order", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("held", SPEC);
    const e = await expectProblem(
      srv.client.putCache("held", { ...SPEC, dtype: "bfloat16" }),
      409,
      "cache_conflict",
      ["dtype"],
    );
    const kv = e.problem.issues!.find((i) => i.path[0] === "kv_cache_dtype");
    assert.equal(
      kv?.message,
      'is "auto" (stores bfloat16) but cache held has "auto" (stores float16)',
    );
    const all = await expectProblem(
      srv.client.putCache("held", {
        ...SPEC,
        num_blocks: 3,
        dtype: "float32",
        kv_cache_dtype: "fp8",
        layout: "HND",
      }),
      409,
      "cache_conflict",
      ["num_blocks"],
    );
    assert.deepEqual(all.problem.issues!.map((i) => i.path[0]), [
      "num_blocks",
      "dtype",
      "kv_cache_dtype",
      "layout",
    ]);
    // Two names of one storage are the same spec.
    const same = await srv.client.putCache("held", { ...SPEC, kv_cache_dtype: "float16" });
    assert.equal(same.created, false);
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});
