/**
 * The HTTP bench's own client (bench/http_conn.ts, bench/http_client.ts) against real servers
 * on loopback: requests built whole, answers by Content-Length, chunked or ended by a close,
 * keep-alive reuse of one connection, a server that closes (by `Connection: close` or while
 * idle), error answers; the `Server-Timing` durations and the report's share outside the
 * server; the `--client` flag.
 */
import assert from "node:assert/strict";
import { parseHttpBenchArgs } from "../../bench/http_bench.ts";
import { caller, serverTimings } from "../../bench/http_client.ts";
import { HttpConn, rawRequest } from "../../bench/http_conn.ts";
import { phaseStats } from "../../bench/http_stats.ts";
import { Rng } from "../support/rng.ts";

function randomBytes(rng: Rng, n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = rng.int(256);
  return out;
}

/** A Deno.serve echo server: answers the body reversed, in the way the path asks. */
function echoServer() {
  const ports: number[] = [], requests: { path: string; headers: Headers }[] = [];
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    async (req, info) => {
      ports.push((info.remoteAddr as Deno.NetAddr).port);
      const body = (await req.bytes()).reverse();
      const path = new URL(req.url).pathname;
      requests.push({ path, headers: req.headers });
      if (path === "/chunked") {
        const half = body.byteLength >> 1;
        return new Response(
          new ReadableStream({
            start(c) {
              c.enqueue(body.slice(0, half));
              c.enqueue(body.slice(half));
              c.close();
            },
          }),
        );
      }
      if (path === "/close") return new Response(body, { headers: { connection: "close" } });
      if (path === "/missing") return Response.json({ code: "not_found" }, { status: 404 });
      return new Response(body, { headers: { "server-timing": "parse;dur=0.125" } });
    },
  );
  const url = `http://127.0.0.1:${server.addr.port}`;
  return { url, ports, requests, close: () => server.shutdown() };
}

Deno.test("bench http conn: a request is its head and body in one buffer", () => {
  const body = new Uint8Array([1, 2, 3]);
  const r = rawRequest("POST", "http://h:8/v1/x?a=1", { "x-k": "v" }, body);
  const text = new TextDecoder().decode(r.subarray(0, r.byteLength - 3));
  assert.equal(text, "POST /v1/x?a=1 HTTP/1.1\r\nhost: h:8\r\nx-k: v\r\ncontent-length: 3\r\n\r\n");
  assert.deepEqual(r.subarray(r.byteLength - 3), body);
  assert.throws(() => rawRequest("POST", "http://h/", { "x-k": "v\r\nevil: 1" }, body), /line/);
  assert.throws(() => new HttpConn("https://h/"), /plain http/);
});

Deno.test("bench http conn: keep-alive answers by length, chunked and close", async () => {
  const srv = echoServer();
  const conn = new HttpConn(srv.url);
  const rng = new Rng(21);
  try {
    for (const n of [0, 1, 70_000, 3_000_001]) {
      const body = randomBytes(rng, n);
      const a = await conn.send(rawRequest("POST", `${srv.url}/echo`, {}, body));
      assert.equal(a.status, 200);
      assert.equal(a.headers.get("server-timing"), "parse;dur=0.125");
      assert.deepEqual(a.body, body.slice().reverse(), `${n} bytes by length`);
      assert.equal(a.body.byteOffset % 8, 0);
      const c = await conn.send(rawRequest("POST", `${srv.url}/chunked`, {}, body));
      assert.equal(c.headers.get("transfer-encoding"), "chunked");
      assert.deepEqual(c.body, body.slice().reverse(), `${n} bytes chunked`);
    }
    assert.equal(new Set(srv.ports).size, 1, "every call on one connection");
    const closing = await conn.send(rawRequest("POST", `${srv.url}/close`, {}, new Uint8Array(5)));
    assert.equal(closing.body.byteLength, 5);
    const after = await conn.send(rawRequest("POST", `${srv.url}/echo`, {}, new Uint8Array([7])));
    assert.deepEqual(after.body, new Uint8Array([7]));
    assert.equal(new Set(srv.ports).size, 2, "a new connection after Connection: close");
    const missing = await conn.send(rawRequest("POST", `${srv.url}/missing`, {}, new Uint8Array()));
    assert.equal(missing.status, 404);
    assert.deepEqual(JSON.parse(new TextDecoder().decode(missing.body)), { code: "not_found" });
  } finally {
    conn.close();
    await srv.close();
  }
});

Deno.test("bench http conn: a connection the server closed while idle is reopened", async () => {
  // A server that answers one request per connection, then closes it without saying so.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let accepted = 0;
  const serving = (async () => {
    for await (const c of listener) {
      accepted++;
      const buf = new Uint8Array(4096);
      let text = "";
      while (!text.includes("\r\n\r\n")) {
        const n = await c.read(buf);
        if (n === null) break;
        text += new TextDecoder().decode(buf.subarray(0, n));
      }
      await c.write(new TextEncoder().encode(`HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok`));
      c.close();
    }
  })();
  const url = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
  const conn = new HttpConn(url);
  try {
    for (let i = 0; i < 3; i++) {
      await new Promise((r) => setTimeout(r, 20)); // let the close arrive
      const a = await conn.send(rawRequest("GET", `${url}/`, {}, new Uint8Array()));
      assert.equal(new TextDecoder().decode(a.body), "ok");
    }
    assert.equal(accepted, 3);
  } finally {
    conn.close();
    listener.close();
    await serving.catch(() => {});
  }
});

Deno.test("bench http client: both callers send the forward call and read its answer", async () => {
  const srv = echoServer();
  try {
    const body = randomBytes(new Rng(22), 10_000);
    for (const kind of ["raw", "fetch"] as const) {
      const c = caller(kind, srv.url, { "x-extra": "1" });
      const sent = await c.send(c.prepare(body));
      c.close();
      assert.equal(sent.status, 200);
      assert.deepEqual(sent.body, body.slice().reverse(), kind);
      assert.equal(sent.serverTiming, "parse;dur=0.125", kind);
      const seen = srv.requests.at(-1)!;
      assert.equal(seen.path, "/v1/attention/forward");
      assert.equal(seen.headers.get("x-extra"), "1");
      assert.equal(seen.headers.get("content-type"), "application/octet-stream");
      assert.equal(seen.headers.get("accept"), "application/octet-stream");
    }
  } finally {
    await srv.close();
  }
});

Deno.test("bench http client: Server-Timing durations and the share outside the server", () => {
  assert.deepEqual(serverTimings("parse;dur=0.25, cache;desc=hit, db;dur=2;desc=x, bad;dur=z"), {
    parse: 0.25,
    db: 2,
  });
  assert.deepEqual(serverTimings(undefined), {});
  const s = phaseStats([
    { ms: 3, timings: { total: 1, parse: 0.5 } },
    { ms: 5, timings: { total: 2, parse: 1 } },
    { ms: 4, timings: { total: 1 } },
  ]);
  assert.equal(s.outside_total_ms, 3);
  assert.equal(s.outside_server_ms, 1.5);
  assert.equal(s.server.parse, 0.5);
  assert.equal(parseHttpBenchArgs([]).run.client, "raw");
  assert.equal(parseHttpBenchArgs(["--client", "fetch"]).run.client, "fetch");
  assert.throws(() => parseHttpBenchArgs(["--client", "curl"]), /--client must be one of/);
});

Deno.test("bench http conn: reuseAnswer reads every answer into one kept buffer", async () => {
  const srv = echoServer();
  const reusing = new HttpConn(srv.url, { reuseAnswer: true });
  const fresh = new HttpConn(srv.url);
  const rng = new Rng(22);
  try {
    // Growing, shrinking and growing again: each answer whole and right while it is the last.
    const sizes = [70_000, 3_000, 300_001, 5, 300_001];
    const kept: Uint8Array[] = [];
    for (const n of sizes) {
      const body = randomBytes(rng, n);
      const a = await reusing.send(rawRequest("POST", `${srv.url}/echo`, {}, body));
      assert.deepEqual(a.body, body.slice().reverse(), `${n} bytes into the kept buffer`);
      kept.push(a.body);
      const b = await fresh.send(rawRequest("POST", `${srv.url}/echo`, {}, body));
      assert.deepEqual(b.body, a.body);
      assert.notEqual(b.body.buffer, a.body.buffer);
    }
    // The last two answers (the buffer grew for the third, fit the fourth and fifth) share it.
    assert.equal(kept[4].buffer, kept[3].buffer);
    assert.equal(kept[4].buffer, kept[2].buffer);
    assert.notEqual(kept[2].buffer, kept[0].buffer, "grown for a larger answer");
    // Chunked answers are not read into it.
    const body = randomBytes(rng, 1000);
    const c = await reusing.send(rawRequest("POST", `${srv.url}/chunked`, {}, body));
    assert.deepEqual(c.body, body.slice().reverse());
    assert.notEqual(c.body.buffer, kept[4].buffer);
  } finally {
    reusing.close();
    fresh.close();
    await srv.close();
  }
});
