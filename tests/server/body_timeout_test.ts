/**
 * A body that stops coming is answered 408 `body_timeout` (`--body-timeout-ms`), on real server
 * processes in each serving mode (one thread, HTTP workers, device threads; `--no-gpu`): a JSON
 * forward (streamed read), a safetensors forward of declared length (read in one piece: a
 * deadline of the limit plus 1 s per 256 KiB declared), a chunked cache create without a
 * length, each stalled after a few bytes. The problem names the limit and what arrived (or the
 * deadline), nothing is created, and the server goes on answering; bodies that keep coming
 * with gaps under the limit (streamed), or within the deadline (in one piece), are read. Before,
 * each stalled call waited for as long as the client kept the connection.
 */
import assert from "node:assert/strict";
import { rawExchange, rawRequest } from "./raw_http.ts";
import { spawnServer } from "./process.ts";

const LIMIT_MS = 300;

interface Stall {
  name: string;
  request: Uint8Array;
  /** The longest the answer may take (the limit, and the whole read's 1 s per 256 KiB). */
  withinMs: number;
  /** A streamed read: the bytes that came; a read in one piece: its deadline instead. */
  received?: number;
  deadline?: number;
}

const json = '{"num_tokens": 1, "query": {"dtype": "float32", "shape": [1, 2, 8], ';
const stalls: Stall[] = [
  {
    name: "a JSON forward, streamed",
    request: rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/json",
      "content-length": "5000",
    }, json),
    withinMs: LIMIT_MS + 2_000,
    received: json.length,
  },
  {
    name: "a safetensors forward, read in one piece",
    request: rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/octet-stream",
      "content-length": "4000",
    }, new Uint8Array(100)),
    withinMs: LIMIT_MS + 1_000 + 2_000,
    deadline: LIMIT_MS + 1_000,
  },
  {
    name: "a chunked cache create",
    request: rawRequest("POST", "/v1/kv-caches", {
      "content-type": "application/json",
      "transfer-encoding": "chunked",
    }, '10\r\n{"num_blocks": 4\r\n'),
    withinMs: LIMIT_MS + 2_000,
    received: 16,
  },
];

async function stallSuite(mode: string[]): Promise<void> {
  const srv = await spawnServer(["--no-gpu", "--body-timeout-ms", String(LIMIT_MS), ...mode]);
  try {
    for (const s of stalls) {
      const t0 = performance.now();
      const r = await rawExchange(srv.port, s.request, { closeWrite: false, timeoutMs: 15_000 });
      const ms = performance.now() - t0;
      assert.ok(r, `${s.name}: no answer in 15 s`);
      assert.equal(r.status, 408, `${s.name}: ${r.text}`);
      const doc = JSON.parse(r.text);
      assert.equal(doc.code, "body_timeout", s.name);
      assert.equal(doc.body_timeout_ms, LIMIT_MS, `${s.name}: ${r.text}`);
      assert.equal(doc.title, "Request Timeout");
      assert.equal(doc.received_bytes, s.received, s.name);
      assert.equal(doc.deadline_ms, s.deadline, s.name);
      assert.match(
        doc.detail,
        s.deadline ? /not whole within 1300 ms/ : new RegExp(`no bytes for ${LIMIT_MS} ms`),
      );
      const least = s.deadline ?? LIMIT_MS;
      assert.ok(ms >= least - 20 && ms < s.withinMs, `${s.name}: answered after ${ms} ms`);
    }
    const metrics = await (await fetch(`${srv.url}/metrics`)).text();
    const caches = [...metrics.matchAll(/^attn_kv_caches(?:\{[^}]*\})? (\d+)$/gm)];
    assert.ok(caches.length > 0, "no attn_kv_caches series");
    assert.ok(caches.every((m) => m[1] === "0"), `a stalled create made a cache: ${caches}`);
    assert.equal((await fetch(`${srv.url}/healthz`)).status, 200);
    // A body that keeps coming, slower in all than the limit but with shorter gaps, is read
    // whole (the limit is a gap between bytes, not a deadline).
    const spec = JSON.stringify({
      num_blocks: 4,
      block_size: 16,
      num_kv_heads: 1,
      head_size: 8,
      dtype: "float32",
    });
    const slow = rawRequest("POST", "/v1/kv-caches", {
      "content-type": "application/json",
      "content-length": String(spec.length),
    }, spec);
    const start = slow.length - spec.length;
    const t0 = performance.now();
    const r = await rawExchange(srv.port, slow, { pieces: { size: 10, pauseMs: 200, start } });
    assert.equal(r?.status, 201, `a body sent 10 bytes every 200 ms: ${r?.status} ${r?.text}`);
    assert.ok(performance.now() - t0 > 2 * LIMIT_MS, "the slow body came too fast to tell");
    // A body read in one piece that is whole before its deadline (1.3 s here) but took longer
    // than the limit is read too (zeros: not safetensors, so a 400 once read).
    const steady = rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/octet-stream",
      "content-length": "4000",
    }, new Uint8Array(4000));
    const start2 = steady.length - 4000;
    const w = await rawExchange(srv.port, steady, {
      pieces: { size: 1000, pauseMs: 200, start: start2 },
    });
    assert.equal(w?.status, 400, `a body in one piece over 0.8 s: ${w?.status} ${w?.text}`);
    assert.match(w!.text, /safetensors/);
  } finally {
    srv.kill("SIGKILL");
    await srv.exited;
  }
}

Deno.test("body timeout: one thread", () => stallSuite([]));
Deno.test("body timeout: HTTP workers", () => stallSuite(["--http-workers", "2"]));
Deno.test("body timeout: device threads", () => stallSuite(["--device-threads", "2"]));
