/**
 * Bounded request work over a real port: JSON bodies have their own limit (safetensors keep the
 * general one), a declared length over the limit is refused before any byte is read, deep
 * nesting and oversized containers are refused before JSON.parse (in JSON bodies, safetensors
 * headers and `__metadata__.request`), and a body the client stops sending is a 400
 * `body_incomplete`, not a logged 500.
 */
import assert from "node:assert/strict";
import { forwardBodyToSafetensors } from "../../client/client.ts";
import { serializeSafetensors } from "../../core/safetensors.ts";
import { DEFAULT_MAX_JSON_BODY_BYTES } from "../../server/body.ts";
import { MAX_JSON_DEPTH, MAX_JSON_VALUES, scanJson } from "../../wire/json_scan.ts";
import { encoderCall, maxAbsDiff, serverMode, startServer } from "./helpers.ts";
import { rawExchange, rawRequest, type RawResponse } from "./raw_http.ts";

const H = 2, D = 8;

/** An encoder_only call of T tokens (no cache) and its float64 reference. */
const encoderBody = (T: number) => encoderCall(T, H, D);

function assertProblem(
  r: RawResponse | null,
  status: number,
  code: string,
): Record<string, unknown> {
  assert.ok(r, "an answer, not a reset");
  assert.equal(r.status, status, r.text);
  assert.equal(r.headers.get("content-type"), "application/problem+json");
  const doc = JSON.parse(r.text);
  assert.equal(doc.status, status);
  assert.equal(doc.code, code, r.text);
  for (const k of ["type", "title", "detail"]) assert.equal(typeof doc[k], "string", k);
  return doc;
}

const post = (path: string, body: string | Uint8Array, ct = "application/json") =>
  rawRequest("POST", path, { "content-type": ct, "content-length": String(body.length) }, body);

Deno.test("limits: JSON bodies have their own limit; safetensors keep the general one", async () => {
  const srv = await startServer({ maxJsonBodyBytes: 4096, maxBodyBytes: 1024 * 1024 });
  try {
    const { body, ref } = encoderBody(24);
    const json = JSON.stringify(body);
    assert.ok(json.length > 4096);
    const r = await rawExchange(srv.port, post("/v1/attention/forward", json));
    const doc = assertProblem(r, 413, "body_too_large");
    assert.equal(doc.max_json_body_bytes, 4096);
    assert.match(String(doc.detail), /JSON request body of \d+ bytes exceeds the 4096-byte limit/);
    // Chunked (no Content-Length): counted while streaming.
    const chunked = await fetch(`${srv.url}/v1/attention/forward`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: ReadableStream.from([new TextEncoder().encode(json)]),
    });
    assert.equal(chunked.status, 413);
    assert.equal((await chunked.json()).max_json_body_bytes, 4096);
    // The same call as safetensors is under the general limit and computes.
    const bin = forwardBodyToSafetensors(body);
    assert.ok(bin.length > 4096);
    const ans = await srv.client.forward(body, { binary: true });
    const err = maxAbsDiff(ans.output.values, ref);
    assert.ok(err < 1e-5, `safetensors answer vs float64 reference: ${err}`);
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("limits: default JSON limit; a declared length over it is refused before reading", async () => {
  assert.equal(DEFAULT_MAX_JSON_BODY_BYTES, 64 * 1024 * 1024);
  const srv = await startServer({ maxBodyBytes: 512 * 1024 * 1024 });
  try {
    // 100 MiB declared, nothing sent: the answer comes from the header alone.
    const head = rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/json",
      "content-length": String(100 * 1024 * 1024),
    });
    const doc = assertProblem(await rawExchange(srv.port, head), 413, "body_too_large");
    assert.equal(doc.max_json_body_bytes, DEFAULT_MAX_JSON_BODY_BYTES);
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("limits: nesting deeper than 32 is a 400 json_too_deep, before JSON.parse", async () => {
  const srv = await startServer();
  try {
    const deep = (n: number) => "[".repeat(n) + "]".repeat(n);
    // The reported case: 10,000 levels in num_blocks (was a 500 from a stack overflow).
    for (const n of [10_000, 100_000, MAX_JSON_DEPTH]) {
      const r = await rawExchange(srv.port, post("/v1/kv-caches", `{"num_blocks": ${deep(n)}}`));
      // MAX_JSON_DEPTH in total (the object is one level) is one too many; one less parses.
      const doc = assertProblem(r, 400, "json_too_deep");
      assert.equal(doc.max_depth, MAX_JSON_DEPTH);
      assert.match(String(doc.detail), /deeper than 32 levels/);
    }
    const ok = await rawExchange(
      srv.port,
      post("/v1/kv-caches", `{"num_blocks": ${deep(MAX_JSON_DEPTH - 1)}}`),
    );
    assertProblem(ok, 400, "invalid_request");
    // Brackets inside strings do not count.
    const inString = await rawExchange(
      srv.port,
      post("/v1/kv-caches", JSON.stringify({ num_blocks: deep(10_000) + '\\"[' })),
    );
    assertProblem(inString, 400, "invalid_request");
    // Every route with a JSON body, and JSON inside safetensors.
    for (const path of ["/v1/backends/select", "/v1/attention/forward"]) {
      assertProblem(
        await rawExchange(srv.port, post(path, `{"dtype": ${deep(10_000)}}`)),
        400,
        "json_too_deep",
      );
    }
    const q = { dtype: "F32" as const, shape: [1], data: new Uint8Array(4) };
    const inRequest = serializeSafetensors({ query: q }, { request: `{"dtype":${deep(10_000)}}` });
    const d1 = assertProblem(
      await rawExchange(
        srv.port,
        post("/v1/attention/forward", inRequest, "application/octet-stream"),
      ),
      400,
      "json_too_deep",
    );
    assert.match(String(d1.detail), /^__metadata__\.request nests/);
    const hdr = new TextEncoder().encode(`{"query":${deep(100_000)}}`);
    const inHeader = new Uint8Array(8 + hdr.length);
    new DataView(inHeader.buffer).setBigUint64(0, BigInt(hdr.length), true);
    inHeader.set(hdr, 8);
    const d2 = assertProblem(
      await rawExchange(
        srv.port,
        post("/v1/attention/forward", inHeader, "application/octet-stream"),
      ),
      400,
      "json_too_deep",
    );
    assert.match(String(d2.detail), /^safetensors header nests/);
    assert.deepEqual(srv.errors, [], "no unexpected errors");
  } finally {
    await srv.close();
  }
});

Deno.test("limits: at most 2^23 JSON values per body, far from V8's fatal 2^27 elements", async () => {
  // V8 aborts the process (uncatchable) when JSON.parse builds an array of 2^27 elements: the
  // 420 MiB crash. The value count is capped far below that, whatever the byte limit.
  assert.equal(MAX_JSON_VALUES, 2 ** 23);
  const bytes = (s: string) => new TextEncoder().encode(s);
  scanJson(bytes("[1,2,3]"), { maxValues: 3 });
  scanJson(bytes('["a,b,c,d"]'), { maxValues: 1 }); // commas in strings do not count
  scanJson(bytes('[["\\"],[","]]'), { maxValues: 2 }); // nor escaped quotes' neighbours
  assert.throws(() => scanJson(bytes("[1,2,3,4]"), { maxValues: 3 }), /more than 3 JSON values/);
  assert.throws(() => scanJson(bytes('{"a":[1],"b":[2]}'), { maxValues: 1 }), /more than 1 JSON/);
  assert.throws(() => scanJson(bytes("[[1],[2],[3]]"), { maxValues: 2 }), /more than 2 JSON/);
  // Over HTTP at the real cap: 2^23 + 1 zeros (16 MiB): refused before JSON.parse. The same
  // count in 64 MiB (the default JSON limit) of zeros took 4-10 s and ~930 MiB to reject.
  const srv = await startServer();
  try {
    const n = MAX_JSON_VALUES + 1;
    const body = new Uint8Array(2 * n + 1).fill(0x2c); // "[0,0,...,0]"
    body[0] = 0x5b;
    for (let i = 1; i < body.length; i += 2) body[i] = 0x30;
    body[body.length - 1] = 0x5d;
    const t0 = performance.now();
    const r = await rawExchange(srv.port, post("/v1/backends/select", body), { timeoutMs: 60_000 });
    const doc = assertProblem(r, 413, "json_too_many_values");
    assert.equal(doc.max_json_values, MAX_JSON_VALUES);
    console.log(`16 MiB of zeros refused in ${(performance.now() - t0).toFixed(0)} ms`);
    // Just under the cap parses (and fails the schema, as a number array should).
    const under = new Uint8Array(2 * (n - 1) + 1).fill(0x2c);
    under[0] = 0x5b;
    for (let i = 1; i < under.length; i += 2) under[i] = 0x30;
    under[under.length - 1] = 0x5d;
    assertProblem(
      await rawExchange(srv.port, post("/v1/backends/select", under)),
      400,
      "invalid_request",
    );
  } finally {
    await srv.close();
  }
});

Deno.test("limits: a body that stops halfway is a 400 body_incomplete, not a logged 500", async () => {
  const srv = await startServer();
  try {
    const json = JSON.stringify(encoderBody(4).body);
    const half = json.slice(0, json.length >> 1);
    // The client says 2x bytes, sends half and stops (half-close: it still reads the answer).
    const req = rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/json",
      "content-length": String(json.length),
    }, half);
    // Deno's server may drop an answer that is not ready when the client half-closes mid-body
    // (a bare Deno.serve handler that awaits the body loses it too); behind the HTTP workers
    // the answer takes a message round trip, so there an answer is checked only if one came
    // (the metrics below count the 400 either way).
    const r = await rawExchange(srv.port, req, {
      timeoutMs: serverMode.httpWorkers ? 2000 : 10000,
    });
    if (r !== null || serverMode.httpWorkers === 0) {
      const doc = assertProblem(r, 400, "body_incomplete");
      assert.equal(doc.received_bytes, half.length);
    }
    // The client goes away entirely mid-body (no one reads the answer), in pieces.
    const gone = rawRequest("POST", "/v1/kv-caches", {
      "content-type": "application/json",
      "content-length": "1000",
    }, '{"num_blocks": 4, "block_size"');
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
    await conn.write(gone);
    await new Promise((r) => setTimeout(r, 50));
    conn.close();
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(srv.errors, [], "not logged as unexpected");
    const text = srv.metrics.render();
    assert.match(
      text,
      /attn_http_requests_total\{route="\/v1\/attention\/forward",method="POST",status="400"\} 1/,
    );
    assert.match(
      text,
      /attn_http_requests_total\{route="\/v1\/kv-caches",method="POST",status="400"\} 1/,
    );
    assert.doesNotMatch(text, /status="500"/);
    assert.deepEqual(await srv.client.health(), { status: "ok" });
  } finally {
    await srv.close();
  }
});

Deno.test("limits: a safetensors forward body cut short is a 400 body_incomplete naming its declared length", async () => {
  // Safetensors forward bodies are read in one piece (readBody's `whole`): a cut one must
  // still be a 400 naming the declared length, not a 500, and leave the server serving.
  const srv = await startServer();
  try {
    const { body, ref } = encoderBody(4);
    const bytes = forwardBodyToSafetensors(body);
    const half = bytes.subarray(0, bytes.byteLength >> 1);
    const req = rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/octet-stream",
      "content-length": String(bytes.byteLength),
    }, half);
    const r = await rawExchange(srv.port, req, {
      timeoutMs: serverMode.httpWorkers ? 2000 : 10000,
    });
    if (r !== null || serverMode.httpWorkers === 0) {
      const doc = assertProblem(r, 400, "body_incomplete");
      const named = doc.received_bytes ?? doc.declared_bytes;
      assert.ok(
        named === half.byteLength || named === bytes.byteLength,
        `names what came or what was declared: ${JSON.stringify(doc)}`,
      );
      assert.match(String(doc.detail), new RegExp(`${bytes.byteLength} declared`));
    }
    assert.deepEqual(srv.errors, [], "not logged as unexpected");
    // The whole body, read in one piece, is computed right.
    const ok = await rawExchange(
      srv.port,
      post("/v1/attention/forward", bytes, "application/octet-stream"),
    );
    assert.ok(ok, "an answer");
    assert.equal(ok.status, 200, ok.text);
    const out = JSON.parse(ok.text).output;
    const got = Array.from(new Float32Array(Uint8Array.fromBase64(out.base64).buffer));
    assert.ok(maxAbsDiff(got, ref) < 1e-5, `max diff ${maxAbsDiff(got, ref)}`);
  } finally {
    await srv.close();
  }
});
