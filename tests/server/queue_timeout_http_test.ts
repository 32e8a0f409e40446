/**
 * `X-Attention-Queue-Timeout-Ms` over a real port: a call queued behind a slow call on its cache
 * past its timeout is a 503 `queue_timeout` (Retry-After 0, not logged, nothing written); one
 * that starts in time runs; a bad value is a 400 `invalid_header` naming the header and value,
 * and the call does not run. The typed client's `queueTimeoutMs` sends the header.
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { QUEUE_TIMEOUT_HEADER } from "../../wire/names.ts";
import { deferred, type FakeBackend, fakeBackend } from "../service/helpers.ts";
import { expectProblem, oneTokenBody, startServer, type TestServer } from "./helpers.ts";

const H = 4, HKV = 2, D = 8, BS = 4, NB = 4;
const SPEC = { num_blocks: NB, block_size: BS, num_kv_heads: HKV, head_size: D, dtype: "float32" };

const decodeBody = (kv_cache: string, slot: number) =>
  oneTokenBody(kv_cache, slot, { h: H, hkv: HKV, d: D });

/** The fake backend's writes: 1 in the first K byte of each slot a run wrote. */
const written = (be: FakeBackend) => be.created[0].key.reduce((n, x) => n + x, 0);

async function post(srv: TestServer, body: ForwardBody, headers: Record<string, string>) {
  const res = await fetch(`${srv.url}/v1/attention/forward`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

/** A server whose backend holds its first run until `release`. */
async function gatedServer() {
  const be = fakeBackend();
  const srv = await startServer({ backends: [be as AttentionBackend] });
  const info = await srv.client.createCache(SPEC as never);
  const gate = deferred(), started = deferred();
  be.gate = gate.promise;
  be.onRunStart = () => started.resolve();
  const first = srv.client.forward(decodeBody(info.id, 0));
  await started.promise;
  return { be, srv, id: info.id, first, release: () => gate.resolve() };
}

Deno.test("queue timeout over HTTP: a call queued past it is a 503 queue_timeout and writes nothing", async () => {
  const { be, srv, id, first, release } = await gatedServer();
  try {
    // Answered once the timeout passes, while the first call still holds the cache.
    const r = await post(srv, decodeBody(id, 5), { [QUEUE_TIMEOUT_HEADER]: "5" });
    release();
    await first;
    await new Promise((r) => setTimeout(r, 20)); // its turn came: it must still do nothing
    assert.equal(r.status, 503, JSON.stringify(r.body));
    assert.equal(r.headers.get("content-type"), "application/problem+json");
    assert.equal(r.body.code, "queue_timeout");
    assert.equal(r.body.queue_timeout_ms, 5);
    assert.ok(r.body.waited_ms > 5, `waited_ms ${r.body.waited_ms}`);
    assert.equal(r.body.retryable, true);
    assert.equal(r.headers.get("retry-after"), "0");
    assert.match(r.headers.get("server-timing") ?? "", /^parse;dur=/);
    assert.equal(r.body.error_id, undefined, "not a fault: no error id");
    assert.equal(srv.errors.length, 0, "not logged as a fault");
    assert.equal(be.runs, 1, "the timed-out call reached no backend");
    assert.equal(written(be), 1, "only the first call wrote");
  } finally {
    await srv.close();
  }
});

Deno.test("queue timeout over HTTP: the client's queueTimeoutMs, in time and too late", async () => {
  const { be, srv, id, first, release } = await gatedServer();
  try {
    const late = srv.client.forward(decodeBody(id, 5), { queueTimeoutMs: 5, binary: true });
    const inTime = srv.client.forward(decodeBody(id, 6), { queueTimeoutMs: 60_000 });
    const e = await expectProblem(late, 503, "queue_timeout");
    release();
    await first;
    assert.equal(e.retryAfter, 0);
    const ok = await inTime;
    assert.deepEqual(ok.output.shape, [1, H, D]);
    assert.equal(be.runs, 2);
    assert.equal(written(be), 2, "the first call and the one in time wrote");
  } finally {
    await srv.close();
  }
});

Deno.test("queue timeout over HTTP: a bad header value is a 400 invalid_header, and nothing runs", async () => {
  const be = fakeBackend();
  const srv = await startServer({ backends: [be as AttentionBackend] });
  try {
    const info = await srv.client.createCache(SPEC as never);
    for (const bad of ["", "0", "0.0", "-1", "+5", "1e3", "5ms", "abc", "2147483648", "1 2"]) {
      const r = await post(srv, decodeBody(info.id, 5), { [QUEUE_TIMEOUT_HEADER]: bad });
      assert.equal(r.status, 400, `${JSON.stringify(bad)}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.code, "invalid_header");
      assert.equal(r.body.header, QUEUE_TIMEOUT_HEADER);
      assert.equal(r.body.value, bad);
      assert.ok(r.body.detail.includes(JSON.stringify(bad)), r.body.detail);
    }
    assert.equal(be.runs, 0);
    assert.equal(written(be), 0);
    // Decimals and the largest value are taken. A call given 0.5 ms may run or time out (its
    // validation counts, and a loaded machine may take longer), but it is
    // never refused; the others run.
    for (const good of ["20000.5", "0.5", "2147483647"]) {
      const r = await post(srv, decodeBody(info.id, 5), { [QUEUE_TIMEOUT_HEADER]: good });
      const ran = r.status === 200;
      const late = r.status === 503 && r.body.code === "queue_timeout" && good === "0.5";
      assert.ok(ran || late, `${JSON.stringify(good)}: ${r.status} ${JSON.stringify(r.body)}`);
    }
  } finally {
    await srv.close();
  }
});
