/**
 * A body that stops coming is answered 408 `body_timeout` (`--body-timeout-ms`), on real server
 * processes in each serving mode (one thread, HTTP workers, device threads, device threads
 * serving the port; `--no-gpu`): a JSON forward (streamed read), a safetensors forward of
 * declared length (read in one piece: a deadline of the limit plus 1 s per 256 KiB declared), a
 * chunked cache create without a length, a `PUT` create of declared length, each stalled after
 * a few bytes. The problem names the limit and what arrived (or the deadline), nothing is
 * created, and the server goes on answering; bodies that keep coming with gaps under the limit
 * (streamed), or within the deadline (in one piece), are read. Before, each stalled call waited
 * for as long as the client kept the connection; and with `--device-threads-http` a stalled
 * forward a device thread passed to the main thread was a 400 `body_incomplete` (the main
 * thread read the body again, and took the timeout for an error), and a stalled `PUT` create
 * a 408 "after 0 of the 1000 declared bytes" when 14 had come.
 */
import assert from "node:assert/strict";
import { rawExchange, rawRequest } from "./raw_http.ts";
import { spawnServer } from "./process.ts";
import { serverMode } from "./helpers.ts";

const LIMIT_MS = 300;

interface Stall {
  name: string;
  request: Uint8Array;
  /** The longest the answer may take (the limit, and the whole read's 1 s per 256 KiB). */
  withinMs: number;
  /** A streamed read: the bytes that came; a read in one piece: its deadline instead. */
  received?: number;
  deadline?: number;
  /** The declared length of a streamed read, when it has one. */
  declared?: number;
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
    declared: 5000,
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
  {
    name: "a PUT cache create of declared length",
    request: rawRequest("PUT", "/v1/kv-caches/stalled", {
      "content-type": "application/json",
      "content-length": "1000",
    }, '{"num_blocks":'),
    withinMs: LIMIT_MS + 2_000,
    received: 14,
    declared: 1000,
  },
];

/** What the 408's detail says: the deadline, or what arrived of what was declared. */
function stallDetail(s: Stall): RegExp {
  if (s.deadline) return new RegExp(`not whole within ${s.deadline} ms`);
  const of = s.declared !== undefined ? ` of the ${s.declared} declared` : "";
  return new RegExp(`stalled after ${s.received}${of} bytes: no bytes for ${LIMIT_MS} ms`);
}

/** Sends stall `s` and checks its 408 (throws on the first thing wrong). */
async function checkStall(port: number, s: Stall): Promise<void> {
  const t0 = performance.now();
  const r = await rawExchange(port, s.request, { closeWrite: false, timeoutMs: 15_000 });
  const ms = performance.now() - t0;
  assert.ok(r, "no answer in 15 s");
  assert.equal(r.status, 408, r.text);
  // README (Reliability): the 408 says Connection: close (it did not until v0.24).
  assert.equal(r.headers.get("connection"), "close", "Connection: close on the 408");
  const doc = JSON.parse(r.text);
  assert.equal(doc.code, "body_timeout");
  assert.equal(doc.body_timeout_ms, LIMIT_MS, r.text);
  assert.equal(doc.title, "Request Timeout");
  assert.equal(doc.received_bytes, s.received, r.text);
  assert.equal(doc.deadline_ms, s.deadline, r.text);
  assert.match(doc.detail, stallDetail(s));
  const least = s.deadline ?? LIMIT_MS;
  assert.ok(ms >= least - 20 && ms < s.withinMs, `answered after ${ms} ms`);
}

async function stallSuite(mode: string[]): Promise<void> {
  const srv = await spawnServer(["--no-gpu", "--body-timeout-ms", String(LIMIT_MS), ...mode]);
  try {
    // Every stall is tried, and all that went wrong is reported together.
    const wrong: string[] = [];
    // The service's own HTTP/1.1 server (--http-engine http1, on the main thread or the HTTP
    // workers) reads every body as it comes: a safetensors body too is timed by its gaps, and
    // says what arrived.
    const own = serverMode.engine === "http1" && !mode.includes("--device-threads-http");
    for (const s0 of stalls) {
      const s = own && s0.deadline !== undefined
        ? { ...s0, deadline: undefined, received: 100, declared: 4000 }
        : s0;
      await checkStall(srv.port, s).catch((e) => wrong.push(`${s.name}: ${e.message}`));
    }
    assert.deepEqual(wrong, []);
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
Deno.test(
  "body timeout: device threads serving the port",
  () => stallSuite(["--device-threads", "2", "--device-threads-http"]),
);
