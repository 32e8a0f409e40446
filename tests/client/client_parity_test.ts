/**
 * The typed client sends a body so that the server judges it the same on both transports, and
 * reads every answer back as the server sent it (each case failed before its fix, found by an
 * audit of the client):
 * - safetensors: metadata the I32 tensor cannot hold as JSON would (beyond int32, fractions,
 *   mixed rows), unknown fields and malformed tensors go as JSON instead, for the server to
 *   name; they were wrapped, truncated or dropped (a slot 2^32 + 5 wrote slot 5), or thrown as
 *   local TypeErrors and 500s;
 * - JSON: NaN, infinities and -0 go as base64 (JSON text made them null or 0), and answers come
 *   in base64, so an infinite output is not read back as NaN;
 * - errors: any error body becomes an AttentionApiError with a string code, Retry-After is kept,
 *   a call takes an AbortSignal;
 * - a cache moves with cacheData then putCacheData.
 */
import assert from "node:assert/strict";
import { AttentionApiError, AttentionClient, type ForwardBody } from "../../client/client.ts";
import { cacheSnapshot, startServer, type TestServer } from "../server/helpers.ts";
import { HeldSeq } from "../server/held_seq.ts";

/** The same call on both transports: refused with `status` and one code, nothing written. */
async function bothRefuse(
  srv: TestServer,
  id: string,
  body: ForwardBody,
  status: number,
  code?: string,
): Promise<void> {
  const before = await cacheSnapshot(srv, id);
  const codes: string[] = [];
  for (const binary of [false, true]) {
    const e = await srv.client.forwardOn(id, body, { binary }).then(() => null, (x) => x);
    assert.ok(e instanceof AttentionApiError, `binary ${binary}: ${e}`);
    assert.equal(e.status, status, `binary ${binary}: ${JSON.stringify(e.problem)}`);
    codes.push(e.code);
    assert.equal(await cacheSnapshot(srv, id), before, `binary ${binary}: nothing written`);
  }
  assert.equal(codes[0], codes[1], "one code on both transports");
  if (code) assert.equal(codes[0], code);
}

Deno.test("client: both transports are judged alike", async (t) => {
  const srv = await startServer();
  try {
    await srv.client.putCache("c", HeldSeq.cacheSpec());
    const { body } = new HeldSeq().step(1);
    const md = body.metadata;
    const withMd = (m: Partial<ForwardBody["metadata"]>) => ({
      ...body,
      metadata: { ...md, ...m },
    });

    await t.step("metadata beyond int32, fractions, mixed rows", async () => {
      await bothRefuse(srv, "c", withMd({ slot_mapping: [2 ** 32 + 5] }), 422, "invalid_batch");
      await bothRefuse(srv, "c", withMd({ slot_mapping: [2 ** 31] }), 422, "invalid_batch");
      await bothRefuse(srv, "c", withMd({ slot_mapping: [5.7] }), 400);
      await bothRefuse(
        srv,
        "c",
        withMd({ slot_mapping: { dtype: "int32", shape: [1], data: [2 ** 32] } }),
        400,
      );
      const mixed = withMd({ block_table: [[3], 0] as unknown as number[][] });
      await bothRefuse(srv, "c", mixed, 400);
    });

    await t.step("unknown fields and malformed tensors", async () => {
      const typo = { ...body, metadata: { ...md, slot_maping: md.slot_mapping } };
      await bothRefuse(srv, "c", typo as ForwardBody, 400, "invalid_request");
      const extra = { ...body, query: { ...body.query, scale: 2 } };
      await bothRefuse(srv, "c", extra as ForwardBody, 400, "invalid_request");
      const q = body.query as { dtype: string; shape: number[]; data: number[] };
      const bad: unknown[] = [
        { ...q, data: q.data.slice(1) }, // count
        { ...q, dtype: "float99" },
        { dtype: q.dtype, shape: q.shape, base64: "!!" },
        { ...q, base64: "AAAA" }, // both
      ];
      for (const query of bad) await bothRefuse(srv, "c", { ...body, query } as ForwardBody, 400);
    });

    await t.step("NaN and infinities in a tensor are 422 invalid_batch on both", async () => {
      for (const x of [NaN, Infinity, -Infinity]) {
        const v = body.value as { data: number[] };
        const value = { ...body.value, data: [x, ...v.data.slice(1)] };
        await bothRefuse(srv, "c", { ...body, value } as ForwardBody, 422, "invalid_batch");
      }
    });

    await t.step("-0 reaches the cache as -0 on both", async () => {
      const stored: string[] = [];
      for (const binary of [false, true]) {
        await srv.client.putCache(`z${binary}`, HeldSeq.cacheSpec());
        const v = body.value as { data: number[] };
        const value = { ...body.value, data: v.data.map(() => -0) };
        await srv.client.forwardOn(`z${binary}`, { ...body, value } as ForwardBody, { binary });
        stored.push(await cacheSnapshot(srv, `z${binary}`));
      }
      assert.equal(stored[0], stored[1]);
      const d = await srv.client.cacheData("zfalse");
      const vals = new Float32Array(d.value_cache.data.slice().buffer);
      assert.ok(vals.some((x) => Object.is(x, -0)), "a -0 was stored");
    });

    await t.step("an infinite output reads back as Infinity on both", async () => {
      // A value row of +inf at the one key the query sees: the output is +inf, not NaN.
      const seq = new HeldSeq();
      await srv.client.putCache("inf", HeldSeq.cacheSpec());
      const step = seq.step(1).body;
      const v = step.value as { data: number[] };
      const value = { ...step.value, data: v.data.map(() => 1) };
      await srv.client.forwardOn("inf", { ...step, value } as ForwardBody);
      const file = await srv.client.cacheData("inf");
      const vc = new Float32Array(file.value_cache.data.slice().buffer);
      vc.fill(Infinity);
      await srv.client.putCacheData("inf", {
        ...file,
        value_cache: { ...file.value_cache, data: new Uint8Array(vc.buffer) },
      });
      // The same step again with its K/V not written (slot -1): it reads the +inf values.
      const read = { ...step, metadata: { ...step.metadata, slot_mapping: [-1] } };
      const outs = [];
      for (const binary of [false, true]) {
        outs.push(await srv.client.forwardOn("inf", read as ForwardBody, { binary }));
      }
      for (const a of outs) {
        assert.ok(a.output.values.every((x) => x === Infinity), `${a.output.values}`);
      }
    });
  } finally {
    await srv.close();
  }
});

Deno.test("client: error bodies, Retry-After, AbortSignal", async () => {
  const answers: [number, string, Record<string, string>][] = [
    [502, "null", {}],
    [502, '{"message":"Bad Gateway"}', { "content-type": "application/json" }],
    [502, "<html>bad gateway</html>", { "content-type": "text/html" }],
    [503, '{"type":"x","title":"t","status":503,"detail":"d","code":"device_unavailable"}', {
      "retry-after": "7",
    }],
  ];
  for (const [status, text, headers] of answers) {
    const client = new AttentionClient("http://x", {
      fetch: () => Promise.resolve(new Response(text, { status, headers })),
    });
    const e = await client.health().then(() => null, (x) => x);
    assert.ok(e instanceof AttentionApiError, `${text}: ${e}`);
    assert.equal(e.status, status);
    assert.equal(typeof e.code, "string", text);
    if (status === 503) {
      assert.equal(e.code, "device_unavailable");
      assert.equal(e.retryAfter, 7);
    } else {
      assert.equal(e.code, "http_error");
      assert.equal(e.retryAfter, undefined);
    }
  }
  const srv = await startServer();
  try {
    const ac = new AbortController();
    ac.abort();
    const { body } = new HeldSeq().step(1);
    await assert.rejects(srv.client.forward(body, { signal: ac.signal }), /abort/i);
  } finally {
    await srv.close();
  }
});

Deno.test("client: a cache moves with cacheData then putCacheData", async () => {
  const a = await startServer(), b = await startServer();
  try {
    const spec = HeldSeq.cacheSpec();
    await a.client.putCache("m", spec);
    const seq = new HeldSeq();
    await a.client.forwardOn("m", seq.step(3).body);
    await b.client.putCache("m", spec);
    await b.client.putCacheData("m", await a.client.cacheData("m"));
    assert.equal(await cacheSnapshot(b, "m"), await cacheSnapshot(a, "m"));
    const { body, ref } = seq.step(1);
    const got = await b.client.forwardOn("m", body);
    const err = Math.max(...ref.map((x, i) => Math.abs(x - got.output.values[i])));
    assert.ok(err < 1e-5, `moved cache answers as the original: ${err}`);
  } finally {
    await a.close();
    await b.close();
  }
});
