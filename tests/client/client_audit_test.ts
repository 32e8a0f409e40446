/**
 * What an audit of the client found (each failed before its fix):
 * - a NaN or an infinity in a layer field went as JSON `null`, the field's default, and the call
 *   ran (`scale: NaN` with 1/sqrt(head_size)); the client now refuses it, 422 `invalid_batch`
 *   naming the field, and sends nothing;
 * - a caller's `Accept` or `Content-Type` in another letter case was sent beside the client's
 *   own, joined: a binary forward was answered in JSON after it ran and read as a bad
 *   safetensors answer, and JSON bodies got 415; now the call's own replace them, and a JSON
 *   answer to a binary forward is decoded as JSON;
 * - a binary body with a field the transport does not know, or a `null` tensor, went as
 *   safetensors (the unknown field named under `__metadata__`, the null tensor dropped); both
 *   now go as JSON, as the README says, for the server to judge alike;
 * - `Retry-After: 1.5` or `-5` read as "retry now"; a problem without this service's `code`
 *   lost its own title and detail, and a `status` unlike the answer's was kept.
 */
import assert from "node:assert/strict";
import { AttentionApiError, AttentionClient, type ForwardBody } from "../../client/client.ts";
import { maxAbsDiff, startServer } from "../server/helpers.ts";
import { HeldSeq } from "../server/held_seq.ts";

Deno.test("client audit: a NaN or an infinity in a layer field is refused, nothing sent", async () => {
  let sent = 0;
  const c = new AttentionClient("http://x", {
    fetch: () => (sent++, Promise.resolve(new Response("{}"))),
  });
  const { body } = new HeldSeq().step(2);
  for (
    const [field, value] of [
      ["scale", NaN],
      ["scale", Infinity],
      ["logits_soft_cap", -Infinity],
      ["sliding_window", NaN],
    ] as const
  ) {
    for (const binary of [false, true]) {
      const bad = { ...body, layer: { ...body.layer, [field]: value } } as ForwardBody;
      const e = await c.forward(bad, { binary }).then(() => null, (x) => x);
      assert.ok(e instanceof AttentionApiError, `${field} ${value}: ${e}`);
      assert.equal(e.status, 422);
      assert.equal(e.code, "invalid_batch");
      assert.deepEqual(e.problem.issues?.[0]?.path, ["layer", field]);
      assert.match(e.problem.detail, new RegExp(`layer\\.${field} is ${value}`));
    }
  }
  // Non-finite tensor data is not refused: it goes exactly (base64), for the server to judge.
  const nanData = structuredClone(body);
  (nanData.query.data as number[])[0] = NaN;
  await c.forward(nanData).catch(() => {});
  assert.equal(sent, 1, "only the tensor-data NaN was sent");
});

Deno.test("client audit: a caller's Accept or Content-Type in any case does not break a call", async () => {
  const srv = await startServer();
  try {
    const cases: Record<string, string>[] = [
      { Accept: "application/json" },
      { "Content-Type": "application/json" },
      { ACCEPT: "text/plain", "CONTENT-TYPE": "text/plain" },
    ];
    for (const headers of cases) {
      const c = new AttentionClient(srv.url, { headers });
      const seq = new HeldSeq();
      const id = `c-${crypto.randomUUID()}`;
      await c.putCache(id, HeldSeq.cacheSpec());
      for (const binary of [false, true]) {
        const { body, ref } = seq.step(2);
        const ans = await c.forwardOn(id, body, { binary });
        assert.ok(maxAbsDiff(ans.output.values, ref) < 2e-5, `${JSON.stringify(headers)}`);
      }
      await c.deleteCache(id);
    }
  } finally {
    await srv.close();
  }
});

Deno.test("client audit: a JSON answer to a binary forward is decoded, not a bad_response", async () => {
  const answer = {
    backend: "CPU_REFERENCE",
    output: { dtype: "float32", shape: [1, 1, 2], data: [0.5, -2] },
  };
  const c = new AttentionClient("http://x", {
    fetch: () =>
      Promise.resolve(
        new Response(JSON.stringify(answer), { headers: { "content-type": "application/json" } }),
      ),
  });
  const { body } = new HeldSeq().step(1);
  const got = await c.forward(body, { binary: true });
  assert.deepEqual([...got.output.values], [0.5, -2]);
});

Deno.test("client audit: an unknown field or a null tensor goes as JSON, judged as JSON is", async () => {
  const kinds: string[] = [];
  const c = new AttentionClient("http://x", {
    fetch: (_u, init) => {
      kinds.push(new Headers(init?.headers).get("content-type") ?? "");
      return Promise.resolve(new Response("{}", { status: 400 }));
    },
  });
  const { body } = new HeldSeq().step(1);
  await c.forward({ ...body, foo: 1 } as ForwardBody, { binary: true }).catch(() => {});
  await c.forward({ ...body, key: null } as unknown as ForwardBody, { binary: true })
    .catch(() => {});
  await c.forward(body, { binary: true }).catch(() => {});
  assert.deepEqual(kinds, ["application/json", "application/json", "application/octet-stream"]);
});

Deno.test("client audit: Retry-After and problems from elsewhere", async () => {
  const errorFor = async (status: number, text: string, headers: Record<string, string>) => {
    const c = new AttentionClient("http://x", {
      fetch: () => Promise.resolve(new Response(text, { status, headers })),
    });
    const e = await c.health().then(() => null, (x) => x);
    assert.ok(e instanceof AttentionApiError, String(e));
    return e;
  };
  for (const [ra, want] of [["1.5", undefined], ["-5", undefined], ["7", 7], ["soon", undefined]]) {
    const e = await errorFor(503, "x", { "retry-after": ra as string });
    assert.equal(e.retryAfter, want, `Retry-After: ${ra}`);
  }
  const later = new Date(Date.now() + 60_000).toUTCString();
  const e0 = await errorFor(503, "x", { "retry-after": later });
  assert.ok(e0.retryAfter! >= 58 && e0.retryAfter! <= 61, `${later}: ${e0.retryAfter}`);
  // An RFC 9457 problem without a `code` (a gateway's): its own title and detail kept.
  const gw = JSON.stringify({ type: "https://gw/limit", title: "Slow down", detail: "too many" });
  const e1 = await errorFor(429, gw, { "content-type": "application/problem+json" });
  assert.equal(e1.code, "http_error");
  assert.equal(e1.problem.title, "Slow down");
  assert.equal(e1.problem.detail, "too many");
  assert.equal(e1.problem.type, "https://gw/limit");
  // A body's status unlike the answer's: the answer's.
  const odd = '{"type":"x","title":"t","status":200,"detail":"d","code":"internal_error"}';
  const e2 = await errorFor(500, odd, { "content-type": "application/problem+json" });
  assert.equal(e2.status, 500);
  assert.equal(e2.problem.status, 500);
});
