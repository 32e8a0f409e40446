/**
 * The answers the service's own HTTP/1.1 server (server/http1_server.ts) gives itself, before the
 * handler sees a request, counted in `/metrics` as the handler counts its own: refused heads, the
 * head timeout's 408 and the connection cap's 503, each in `attn_http_requests_total` and
 * `attn_http_problems_total` under the route `unmatched` (no route was matched), the method the
 * head began with (`other` for none or one not in metrics.ts KNOWN_METHODS), the status and the
 * problem's code. Scraped over the same real port; main.ts passes the handler's metrics, or with
 * `--device-threads` the front's own (merged under `device_thread="front"`).
 */
import assert from "node:assert/strict";
import { startHttp1Server } from "./helpers.ts";
import { RAW_GET as GET, RAW_POST as POST, rawExchange, rawRequest } from "./raw_http.ts";
import { withEnv } from "../support/env.ts";
import { spawnServer } from "./process.ts";

/** The request and problem samples of route `unmatched` in a scrape over `port`, sorted. */
async function unmatched(port: number): Promise<string[]> {
  const r = await rawExchange(
    port,
    "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
  );
  assert.equal(r?.status, 200, r?.text);
  return r!.text.split("\n").filter((l) =>
    /^attn_http_(requests|problems)_total\{route="unmatched",/.test(l)
  ).sort();
}

const req = (method: string, status: number, n = 1) =>
  `attn_http_requests_total{route="unmatched",method="${method}",status="${status}"} ${n}`;
const prob = (status: number, code: string, n = 1) =>
  `attn_http_problems_total{route="unmatched",status="${status}",code="${code}"} ${n}`;

Deno.test("http1 metrics: refused heads are counted by route unmatched, method, status and code", async () => {
  const srv = await startHttp1Server();
  try {
    assert.deepEqual(await unmatched(srv.port), [], "none before");
    const refused: [string, number][] = [
      ["GARBAGE\r\n\r\n", 400],
      ["GET /healthz\r\n\r\n", 400],
      ["GET /healthz HTTP/9.9\r\nhost: x\r\n\r\n", 505],
      [`${POST}content-length: abc\r\n\r\n`, 400],
      [`GET /healthz?${"a".repeat(70_000)} HTTP/1.1\r\n\r\n`, 431],
      ["get /healthz HTTP/1.1\r\nhost: x\r\n\r\n", 501],
      ["TRACE /healthz HTTP/1.1\r\nhost: x\r\n\r\n", 501],
      [`${GET}expect: 200-ok\r\n\r\n`, 417],
      [`${POST}transfer-encoding: gzip\r\n\r\n{}`, 501],
    ];
    for (const [bytes, status] of refused) {
      const r = await rawExchange(srv.port, bytes, { timeoutMs: 5000 });
      assert.equal(r?.status, status, `${bytes.slice(0, 40)}: ${r?.text}`);
    }
    assert.deepEqual(
      await unmatched(srv.port),
      [
        req("other", 400), // GARBAGE: no method
        req("GET", 400),
        req("GET", 505),
        req("POST", 400),
        req("GET", 431),
        req("other", 501), // `get`: methods are case-sensitive
        req("TRACE", 501),
        req("GET", 417),
        req("POST", 501),
        prob(400, "bad_request", 3),
        prob(505, "http_version_not_supported"),
        prob(431, "headers_too_large"),
        prob(501, "method_not_implemented", 2),
        prob(417, "expectation_failed"),
        prob(501, "not_implemented"),
      ].sort(),
    );
    assert.match(srv.metrics.render(), /^attn_http_requests_in_flight 0$/m, "none left in flight");
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("http1 metrics: the head timeout's 408 and the connection cap's 503 are counted", async () => {
  await withEnv({ ATTN_HTTP_HEAD_TIMEOUT_MS: "200", ATTN_HTTP_MAX_CONNECTIONS: "2" }, async () => {
    const srv = await startHttp1Server();
    try {
      assert.deepEqual(await unmatched(srv.port), [], "none before");
      // A head that stops coming.
      const partial = await rawExchange(srv.port, "GET /healthz HTTP/1.1\r\nhost", {
        closeWrite: false,
        timeoutMs: 3000,
      });
      assert.equal(partial?.status, 408, partial?.text);
      // Two connections open: a third (and a fourth) get the 503 and are closed.
      const held = [await Deno.connect({ port: srv.port }), await Deno.connect({ port: srv.port })];
      try {
        await new Promise((r) => setTimeout(r, 50));
        for (let i = 0; i < 2; i++) {
          const r = await rawExchange(srv.port, `${GET}\r\n`, { timeoutMs: 3000 });
          assert.equal(r?.status, 503, r?.text);
        }
      } finally {
        held.forEach((h) => h.close());
      }
      await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(
        await unmatched(srv.port),
        [
          req("GET", 408),
          req("other", 503, 2), // refused before a byte of its head was read
          prob(408, "head_timeout"),
          prob(503, "too_many_connections", 2),
        ].sort(),
      );
    } finally {
      await srv.close();
    }
  });
});

Deno.test("http1 metrics: main.ts counts them, on one thread and on the device threads' front", async () => {
  const cases: [string[], string][] = [[[], ""], [
    ["--device-threads", "2"],
    'device_thread="front",',
  ]];
  for (const [args, label] of cases) {
    const srv = await spawnServer(["--no-gpu", "--http-engine", "http1", ...args]);
    try {
      const scrape = async () => {
        const m = await rawExchange(srv.port, rawRequest("GET", "/metrics", {}));
        assert.equal(m?.status, 200, m?.text);
        return m!.text.split("\n").filter((l) => l.includes('route="unmatched"')).sort();
      };
      assert.deepEqual(await scrape(), [], `${args}: none before`);
      const r = await rawExchange(srv.port, "GET /healthz HTTP/9.9\r\nhost: x\r\n\r\n");
      assert.equal(r?.status, 505, r?.text);
      const front = (line: string) => line.replace("{", `{${label}`);
      assert.deepEqual(
        await scrape(),
        [req("GET", 505), prob(505, "http_version_not_supported")].map(front).sort(),
        `${args}`,
      );
    } finally {
      srv.kill("SIGTERM");
      await srv.exited;
    }
  }
});

Deno.test("http1 trace: ATTN_TRACE_FILE gets each request's head, body and answer by connection", async () => {
  const file = await Deno.makeTempFile({ prefix: "http1-trace-" });
  const srv = await spawnServer(["--no-gpu", "--http-engine", "http1"], {
    ATTN_TRACE_FILE: file,
  }, ["--allow-write=/tmp"]);
  try {
    const body = JSON.stringify({ head_size: 64, dtype: "float16" });
    const r = await rawExchange(
      srv.port,
      rawRequest("POST", "/v1/backends/select", {
        "content-type": "application/json",
        "content-length": String(body.length),
      }, body),
    );
    assert.equal(r?.status, 200, r?.text);
    // The answer is traced once written: the client may read it first.
    let lines: string[] = [];
    for (let i = 0; i < 100 && lines.length < 3; i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 20));
      lines = (await Deno.readTextFile(file)).split("\n").filter((l) => l.includes(" http1 "));
    }
    assert.deepEqual(
      lines.map((l) => l.replace(/^\S+ /, "").replace(/c\d+/, "cN")),
      [
        "http1 cN: head POST /v1/backends/select",
        "http1 cN: body complete",
        "http1 cN: answer 200 written",
      ],
    );
    assert.ok(lines.every((l) => /^\d{4}-\d\d-\d\dT[\d:.]+Z /.test(l)), lines.join("\n"));
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
    await Deno.remove(file).catch(() => {});
  }
});
