/**
 * Which bodies a route takes by their Content-Type (server/body.ts bodyKind). JSON is UTF-8 only
 * (RFC 8259 8.1): a JSON Content-Type whose `charset` names anything else is a 415
 * `unsupported_media_type` naming the parameter and its value, decided by the head before the
 * body is read (an audit: `charset=latin1` was read, then refused as a 400 `malformed_json`,
 * "not valid UTF-8").
 * @module
 */
import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import { bodyKind, bodyLimits } from "../../server/body.ts";
import { refusedByHead } from "../../server/head_refusal.ts";
import { startServer } from "./helpers.ts";

const post = (contentType: string, path = "/v1/attention/forward") =>
  new Request(`http://127.0.0.1${path}`, {
    method: "POST",
    headers: { "content-type": contentType },
  });

Deno.test("bodyKind: a JSON Content-Type with a charset but utf-8 is a 415 naming it", () => {
  const refused: [string, string][] = [
    ["application/json; charset=latin1", "latin1"],
    ["application/json;charset=ISO-8859-1", "ISO-8859-1"],
    ['application/json; charset="utf-16"', "utf-16"], // quoted
    ["Application/JSON; CHARSET=Windows-1252", "Windows-1252"], // any case
    ["application/problem+json; charset=us-ascii", "us-ascii"], // any +json type
    ["application/json; charset=utf-8; charset=latin1", "latin1"], // any of two
    ["application/json; charset=", ""],
  ];
  for (const [type, charset] of refused) {
    assert.throws(() => bodyKind(post(type), ["json", "binary"]), (e: unknown) => {
      assert.ok(e instanceof ServiceError, type);
      assert.equal(e.status, 415, type);
      assert.equal(e.code, "unsupported_media_type", type);
      assert.equal(e.extra?.charset, charset, type);
      assert.equal(e.extra?.content_type, type);
      assert.deepEqual(e.extra?.accepted_charsets, ["utf-8"]);
      assert.ok(e.message.includes(`charset ${JSON.stringify(charset)}`), e.message);
      return true;
    });
    // The device-threads front does not read a body the route refuses by its head.
    assert.equal(refusedByHead(post(type), bodyLimits()), true, type);
  }
  for (
    const type of [
      "application/json",
      "application/json; charset=utf-8",
      'application/json;charset="UTF-8"',
      "application/json; CharSet=Utf-8",
      "application/json; profile=x",
    ]
  ) {
    assert.equal(bodyKind(post(type), ["json", "binary"]), "json", type);
  }
  // A safetensors body's charset means nothing: read as before.
  assert.equal(
    bodyKind(post("application/octet-stream; charset=latin1"), ["json", "binary"]),
    "binary",
  );
});

Deno.test("JSON routes over HTTP: a charset but UTF-8 is a 415, the body unread", async () => {
  const srv = await startServer();
  try {
    // "é" as latin1 writes it: not UTF-8, so a read body would be a 400 malformed_json.
    const latin1 = new Uint8Array([...new TextEncoder().encode('{"x":"'), 0xe9, 0x22, 0x7d]);
    for (const path of ["/v1/attention/forward", "/v1/kv-caches", "/v1/backends/select"]) {
      const type = "application/json; charset=latin1";
      const res = await fetch(`${srv.url}${path}`, {
        method: "POST",
        headers: { "content-type": type },
        body: latin1,
      });
      const doc = await res.json();
      assert.equal(res.status, 415, `${path}: ${JSON.stringify(doc)}`);
      assert.match(res.headers.get("content-type")!, /^application\/problem\+json/);
      assert.equal(doc.code, "unsupported_media_type");
      assert.equal(doc.charset, "latin1");
      assert.equal(doc.content_type, type);
      assert.deepEqual(doc.accepted_charsets, ["utf-8"]);
    }
    const ok = await fetch(`${srv.url}/v1/backends/select`, {
      method: "POST",
      headers: { "content-type": 'application/json; charset="UTF-8"' },
      body: JSON.stringify({ head_size: 8, dtype: "float32" }),
    });
    assert.equal(ok.status, 200, JSON.stringify(await ok.clone().json()));
    await ok.body?.cancel();
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});
