/**
 * The HTTP worker front (server/worker_front.ts, server/http_worker.ts) on a real port:
 * concurrent clients on their own caches get answers that match the float64 reference; a body
 * the worker must not read is not waited for; the client's going away aborts the handler's
 * signal; a crashed worker is replaced and the server keeps answering; an answer that is not
 * well formed is a 500 problem; the message checks. The suites that run whole through the
 * workers are in http_workers_suites_test.ts.
 */
import { spawnServer } from "./process.ts";
import assert from "node:assert/strict";
import { serveWithWorkers } from "../../server/worker_front.ts";
import { checkFromWorker, checkResponse } from "../../server/worker_protocol.ts";
import { maxAbsDiff, serverMode, startServer } from "./helpers.ts";
import { rawExchange, rawRequest } from "./raw_http.ts";
import { D, F32_CACHE, Seqs } from "./seqs.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Runs `fn` with the test servers behind `n` HTTP workers. */
async function withWorkers<T>(n: number, fn: () => Promise<T>): Promise<T> {
  const before = serverMode.httpWorkers;
  serverMode.httpWorkers = n;
  try {
    return await fn();
  } finally {
    serverMode.httpWorkers = before;
  }
}

Deno.test("http workers: 8 concurrent clients on their own caches match the reference", async () => {
  const srv = await withWorkers(2, () => startServer());
  try {
    const client = async (c: number) => {
      const info = await srv.client.createCache(F32_CACHE);
      const seqs = new Seqs(Math.fround);
      for (const [step, lens] of [[0, [5, 3]], [1, [1, 1]], [2, [1, 1]], [3, [1, 2]]] as const) {
        const { body, refOut, T } = seqs.step([...lens], "float32");
        const binary = (c + step) % 2 === 0;
        const ans = await srv.client.forward({ ...body, kv_cache: info.id }, { binary });
        assert.deepEqual(ans.output.shape, [T, 4, D]);
        const err = maxAbsDiff(ans.output.values, refOut);
        assert.ok(err < 2e-5, `client ${c} step ${step}: max abs err ${err}`);
      }
    };
    await Promise.all(Array.from({ length: 8 }, (_, c) => client(c)));
    assert.deepEqual(srv.errors, []);
  } finally {
    await srv.close();
  }
});

Deno.test("http workers: a refused or oversized body is answered without reading it", async () => {
  const srv = await withWorkers(
    2,
    () => startServer({ maxBodyBytes: 4096, access: { token: "s3cret", allowedHosts: null } }),
  );
  try {
    // 10 MB declared, none of it sent, no half-close: the answer must not wait for the body.
    const head = (auth: string) =>
      rawRequest("POST", "/v1/kv-caches", {
        "content-type": "application/json",
        "content-length": String(10_000_000),
        ...(auth ? { authorization: auth } : {}),
      }, "");
    const t0 = performance.now();
    const refused = await rawExchange(srv.port, head(""), { closeWrite: false, timeoutMs: 5000 });
    assert.equal(refused?.status, 401);
    const big = await rawExchange(srv.port, head("Bearer s3cret"), {
      closeWrite: false,
      timeoutMs: 5000,
    });
    assert.equal(big?.status, 413);
    assert.match(big!.text, /"max_body_bytes":4096/);
    assert.ok(performance.now() - t0 < 4000, "answered before the timeout");
  } finally {
    await srv.close();
  }
});

Deno.test("http workers: the client going away aborts the handler's signal", async () => {
  let aborted = Promise.withResolvers<string>();
  const front = await serveWithWorkers({
    workers: 1,
    port: 0,
    hostname: "127.0.0.1",
    access: {},
    maxBodyBytes: 1 << 20,
  }, async (req) => {
    const body = new Uint8Array(await req.arrayBuffer());
    await new Promise<void>((r) => req.signal.addEventListener("abort", () => r()));
    aborted.resolve(`${req.method} ${new URL(req.url).pathname} ${body.length}`);
    return new Response("late");
  });
  try {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: front.addr.port });
    await conn.write(rawRequest("POST", "/slow", { "content-length": "5" }, "hello"));
    await sleep(100);
    conn.close();
    const seen = await Promise.race([aborted.promise, sleep(5000).then(() => "no abort")]);
    assert.equal(seen, "POST /slow 5");
    aborted = Promise.withResolvers<string>();
  } finally {
    await front.shutdown();
  }
});

Deno.test("http workers: a crashed worker is logged and replaced; the server keeps answering", async () => {
  const errors: unknown[] = [];
  const front = await serveWithWorkers({
    workers: 2,
    port: 0,
    hostname: "127.0.0.1",
    access: {},
    maxBodyBytes: 1 << 20,
    log: (m, e) => errors.push(`${m} ${e}`),
  }, (req) => Promise.resolve(new Response(`ok ${new URL(req.url).pathname}`)));
  try {
    front.fault(0);
    for (let i = 0; i < 50 && errors.length === 0; i++) await sleep(20);
    assert.match(String(errors[0]), /http worker 0 crashed: .*fault injected/);
    await sleep(500); // the replacement starts listening
    assert.equal(front.workers, 2);
    for (let i = 0; i < 20; i++) {
      const r = await rawExchange(front.addr.port, rawRequest("GET", `/n${i}`, {}, ""));
      assert.equal(r?.status, 200, `call ${i}`);
      assert.equal(r!.text, `ok /n${i}`);
    }
  } finally {
    await front.shutdown();
  }
});

Deno.test("http workers: a malformed answer from the service thread is a 500 problem", async () => {
  const worker = new Worker(new URL("../../server/http_worker.ts", import.meta.url), {
    type: "module",
  });
  const listening = Promise.withResolvers<number>();
  worker.onmessage = (e) => {
    const m = e.data;
    if (m.type === "listening") listening.resolve(m.port);
    // Status 99, headers not pairs: not an answer.
    if (m.type === "head") worker.postMessage({ type: "response", id: m.id, status: 99 });
  };
  worker.postMessage({
    type: "init",
    port: 0,
    hostname: "127.0.0.1",
    access: {},
    maxBodyBytes: 1024,
  });
  try {
    const port = await listening.promise;
    const r = await rawExchange(port, rawRequest("GET", "/healthz", {}, ""));
    assert.equal(r?.status, 500);
    assert.equal(r!.headers.get("content-type"), "application/problem+json");
    assert.equal(JSON.parse(r!.text).code, "internal_error");
  } finally {
    worker.terminate();
  }
});

Deno.test("http workers: message checks name what is wrong", () => {
  assert.match(String(checkFromWorker(null)), /not an object/);
  assert.match(String(checkFromWorker({ type: "head", id: -1 })), /bad id/);
  assert.match(
    String(checkFromWorker({ type: "body", id: 1, bytes: "x", end: "complete" })),
    /ArrayBuffer/,
  );
  const ab = new ArrayBuffer(0);
  const body = { type: "body", id: 1, bytes: ab, end: "error" };
  assert.match(String(checkFromWorker({ ...body, uncounted: "yes" })), /uncounted/);
  assert.equal(typeof checkFromWorker({ ...body, uncounted: true }), "object");
  assert.match(String(checkFromWorker({ type: "nope" })), /unknown message type/);
  const head = {
    type: "head",
    id: 3,
    method: "GET",
    url: "http://x/",
    headers: [["a", "b"]],
    hasBody: false,
  };
  assert.deepEqual(checkFromWorker(head), head);
  // An http1 worker's own answer, to be counted on the owner's thread.
  const own = { type: "own_answer", route: "unmatched", method: "GET", status: 505, code: "x" };
  assert.deepEqual(checkFromWorker(own), own);
  assert.match(String(checkFromWorker({ ...own, status: 42 })), /own_answer: bad status 42/);
  assert.match(String(checkFromWorker({ ...own, route: 1 })), /own_answer: route/);
  assert.match(String(checkFromWorker({ ...own, code: 7 })), /own_answer: code/);
  assert.match(
    String(checkResponse({ type: "response", id: 1, status: 99, headers: [] })),
    /status/,
  );
  assert.match(
    String(checkResponse({ type: "response", id: 1, status: 200, headers: [1] })),
    /headers/,
  );
  const ok = { type: "response", id: 1, status: 204, headers: [], body: null };
  assert.deepEqual(checkResponse(ok), ok);
});

Deno.test("http workers: answers taken log nothing (each logged 'an answer before init')", async () => {
  const srv = await spawnServer(["--no-gpu", "--http-workers", "2"]);
  try {
    for (let i = 0; i < 4; i++) {
      const res = await fetch(`${srv.url}/healthz`);
      assert.equal(res.status, 200);
      await res.body?.cancel();
    }
  } finally {
    srv.kill("SIGTERM");
  }
  const { code, stderr } = await srv.exited;
  assert.equal(code, 0, stderr);
  assert.doesNotMatch(stderr, /http worker:/);
});
