/**
 * The forward routes' answer by `Accept` (server/body.ts answerKind, RFC 9110 12.5.1): the
 * most specific media range decides a type's weight, wildcards count, q=0 refuses a type, and
 * a header that accepts neither answer is a 406 `not_acceptable` before the body is read, which
 * leaves a server-held cache as it was.
 * @module
 */
import assert from "node:assert/strict";
import { answerKind } from "../../server/body.ts";
import { ServiceError } from "../../core/errors.ts";
import { forwardBodyToSafetensors } from "../../client/client.ts";
import { parseSafetensors } from "../../core/safetensors.ts";
import { maxAbsDiff, startServer } from "./helpers.ts";
import { HeldSeq } from "./held_seq.ts";
import { cacheBytes, same } from "./fuzz_check.ts";

const kindOf = (accept?: string) =>
  answerKind(
    new Request("http://x/", accept === undefined ? {} : { headers: { accept } }),
  );

Deno.test("answerKind: weights by the most specific range, ties by specificity then order", () => {
  const cases: [string | undefined, "json" | "binary"][] = [
    [undefined, "json"],
    ["", "json"],
    ["*/*", "json"],
    ["application/*", "json"],
    ["application/json", "json"],
    ["application/octet-stream", "binary"],
    ["application/octet-stream, application/json", "binary"], // equal, earlier wins
    ["application/json, application/octet-stream", "json"],
    ["application/octet-stream;q=0.5, application/json", "json"],
    ["application/json;q=0.2, application/octet-stream;q=0.3", "binary"],
    ["application/octet-stream, */*", "binary"], // exact beats the wildcard at equal weight
    ["*/*, application/octet-stream", "binary"],
    ["application/json;q=0, */*", "binary"], // JSON refused, octet-stream through */*
    ["application/json;q=0, application/*", "binary"],
    ["*/*;q=0.1, application/json;q=0", "binary"],
    ["application/octet-stream;q=0, */*", "json"],
    ["Application/Octet-Stream ; Q=1", "binary"], // case-insensitive, spaces
    ["application/json; charset=utf-8", "json"],
    ["text/html, application/octet-stream;q=0.001", "binary"],
    ["application/json;q=2, application/octet-stream", "binary"], // a bad q skips the member
    ["bogus, application/octet-stream", "binary"],
    // Read leniently (a review: each was a 406 for a day, JSON before): Java's default header,
    // q without a leading 0 or with more digits, a bare *, a header where nothing parses.
    ["text/html, image/gif, image/jpeg, *; q=.2, */*; q=.2", "json"],
    ["*/*;q=.5", "json"],
    ["application/json;q=0.5000", "json"],
    ["*", "json"],
    [",", "json"],
    ["application/octet-stream;q=, application/json;q=0.1", "json"], // the empty q is skipped
    ["*; q=.2, application/octet-stream;q=.3", "binary"],
    // A q outside 0..1 or not a number skips its member, as docs/api.md says (an audit asked
    // whether q=1.5 should be a 400; the lenient reading above stays): nothing else, as if absent.
    ["application/octet-stream;q=1.5", "json"],
    ["application/octet-stream;q=-1", "json"],
    ["application/octet-stream;q=high", "json"],
    ["application/octet-stream;q=1.5, application/json;q=0.1", "json"],
    ["application/json;q=1.001, application/octet-stream;q=0.001", "binary"],
  ];
  for (const [accept, want] of cases) assert.equal(kindOf(accept), want, String(accept));
});

Deno.test("answerKind: a header that accepts neither answer is a 406 naming it", () => {
  for (
    const accept of [
      "application/json;q=0",
      "text/html",
      "application/json;q=0, application/octet-stream;q=0",
      "*/*;q=0",
      "application/*;q=0, text/*",
      "image/png, application/octet-stream;q=0.000",
    ]
  ) {
    assert.throws(() => kindOf(accept), (e: unknown) => {
      assert.ok(e instanceof ServiceError, accept);
      assert.equal(e.status, 406, accept);
      assert.equal(e.code, "not_acceptable");
      assert.equal(e.extra?.accept, accept);
      assert.deepEqual(e.extra?.available, ["application/json", "application/octet-stream"]);
      assert.ok(e.message.includes(JSON.stringify(accept)), e.message);
      return true;
    });
  }
});

Deno.test("forward routes over HTTP: 406 writes nothing; wildcards and q=0 pick the answer", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("acc", HeldSeq.cacheSpec());
    const seq = new HeldSeq();
    const first = seq.step(3);
    const ans = await srv.client.forwardOn("acc", first.body);
    assert.ok(maxAbsDiff(ans.output.values, first.ref) < 2e-5);
    const before = await cacheBytes(srv, "acc");
    const { body, ref } = seq.step(1);
    const file = forwardBodyToSafetensors(body) as Uint8Array<ArrayBuffer>;
    const post = (path: string, accept: string, payload: BodyInit, type: string) =>
      fetch(`${srv.url}${path}`, {
        method: "POST",
        headers: { "content-type": type, accept },
        body: payload,
      });
    for (const path of ["/v1/kv-caches/acc/forward", "/v1/attention/forward"]) {
      const payload = path === "/v1/attention/forward"
        ? JSON.stringify({ ...body, kv_cache: "acc" })
        : file;
      const type = path === "/v1/attention/forward"
        ? "application/json"
        : "application/octet-stream";
      const res = await post(path, "application/json;q=0, text/html", payload, type);
      assert.equal(res.status, 406, path);
      assert.match(res.headers.get("content-type")!, /^application\/problem\+json/);
      assert.ok(res.headers.get("server-timing"), "Server-Timing on the 406");
      const doc = await res.json();
      assert.equal(doc.code, "not_acceptable");
      assert.equal(doc.accept, "application/json;q=0, text/html");
      assert.ok(same(await cacheBytes(srv, "acc"), before), `${path}: the 406 wrote the cache`);
    }
    // JSON refused, everything else welcome: the safetensors answer, computed once.
    const bin = await post(
      "/v1/kv-caches/acc/forward",
      "application/json;q=0, */*",
      file,
      "application/octet-stream",
    );
    assert.equal(bin.status, 200);
    assert.equal(bin.headers.get("content-type"), "application/octet-stream");
    const out = parseSafetensors(new Uint8Array(await bin.arrayBuffer())).tensors.output;
    const values = Array.from(new Float32Array(out.data.slice().buffer));
    assert.ok(maxAbsDiff(values, ref) < 2e-5, "the safetensors answer matches float64");
    assert.ok(!same(await cacheBytes(srv, "acc"), before), "the accepted call wrote its K/V");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});
