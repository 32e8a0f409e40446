/**
 * Draining `--device-threads 2 --device-threads-http`, on a real server process (`--no-gpu`):
 * only the device thread that took a call drains it, not the main thread's front it may pass
 * it to. Cut at `--shutdown-deadline-ms`, each call still in flight counts once in "calls
 * unfinished", whether its thread answers it itself (an upload to a cache it holds) or passes
 * it to the front (a create); and a forward whose body (naming another thread's cache) was
 * still arriving at the signal is answered, not refused by the front with a 503. The stop lines
 * count the calls the threads are working on (this thread's drainer has none of them), at the
 * first signal and at a second.
 */
import assert from "node:assert/strict";
import { decodeJsonAnswer, jsonForwardBody } from "../../wire/client_codec.ts";
import { HeldSeq } from "./held_seq.ts";
import { maxAbsDiff } from "./helpers.ts";
import { answerOn, rawRequest } from "./raw_http.ts";
import { type ServerProcess, spawnServer } from "./process.ts";
import { SAME_STOP_MS } from "../../server/shutdown.ts";

const enc = new TextEncoder();
const KEEP_ALIVE = { "content-type": "application/json", connection: "keep-alive" };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The head of a JSON request and the first bytes of a body of 1000 that never finishes. */
function stalled(method: string, path: string): Uint8Array {
  const headers = { "content-type": "application/json", "content-length": "1000" };
  return rawRequest(method, path, headers, '{"num_blocks":');
}

Deno.test("device threads serving the port: a call cut at the deadline counts once", async () => {
  const srv = await spawnServer([
    "--device-threads",
    "2",
    "--device-threads-http",
    "--no-gpu",
    "--shutdown-deadline-ms",
    "500",
  ]);
  const own = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
  const passed = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
  try {
    // Created over `own`, the cache is on the thread serving `own`: a forward on it stays there.
    const spec = JSON.stringify(HeldSeq.cacheSpec());
    await own.write(rawRequest("PUT", "/v1/kv-caches/up", {
      "content-type": "application/json",
      "content-length": String(enc.encode(spec).length),
      connection: "keep-alive",
    }, spec));
    assert.equal((await answerOn(own)).status, 201);
    await own.write(stalled("POST", "/v1/kv-caches/up/forward"));
    // A create goes to the front, whichever thread took it.
    await passed.write(stalled("POST", "/v1/kv-caches"));
    await sleep(300);
    srv.kill("SIGTERM");
    const e = await srv.exited;
    assert.equal(e.code, 1, e.stderr);
    // Counted by the threads that took them (this thread's drainer has none).
    assert.match(e.stderr, /SIGTERM: stopping; finishing 2 calls in flight on the device threads/);
    assert.match(e.stderr, /stopped at the deadline: 2 calls unfinished/);
  } finally {
    own.close();
    passed.close();
    srv.kill("SIGKILL");
    await srv.exited;
  }
});

Deno.test("device threads serving the port: a second signal counts the threads' calls", async () => {
  const srv = await spawnServer(["--device-threads", "2", "--device-threads-http", "--no-gpu"]);
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
  try {
    await conn.write(stalled("POST", "/v1/kv-caches"));
    await sleep(300);
    srv.kill("SIGTERM");
    for (let i = 0; i < 100 && !/SIGTERM: stopping/.test(srv.stderr()); i++) await sleep(20);
    // Past the window in which a repeat is the same stop (a parent's copy of a group signal).
    await sleep(SAME_STOP_MS + 100);
    srv.kill("SIGTERM");
    const e = await srv.exited;
    assert.equal(e.code, 1, e.stderr);
    assert.match(e.stderr, /SIGTERM: stopping; finishing 1 calls in flight on the device threads/);
    assert.match(e.stderr, /SIGTERM again: exiting now with 1 calls unfinished/);
  } finally {
    conn.close();
    srv.kill("SIGKILL");
    await srv.exited;
  }
});

/** attn_kv_caches per device thread, from the merged /metrics. */
async function cachesPerThread(url: string): Promise<number[]> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = [0, 0];
  for (const m of text.matchAll(/^attn_kv_caches\{device_thread="(\d+)"\} (\d+)$/gm)) {
    out[Number(m[1])] = Number(m[2]);
  }
  return out;
}

/** Creates cache `id` over `conn` (keep-alive): on the thread serving `conn`. */
async function create(conn: Deno.Conn, id: string): Promise<void> {
  const spec = enc.encode(JSON.stringify(HeldSeq.cacheSpec()));
  const length = { "content-length": String(spec.length) };
  await conn.write(rawRequest("PUT", `/v1/kv-caches/${id}`, { ...KEEP_ALIVE, ...length }, spec));
  assert.equal((await answerOn(conn)).status, 201);
}

/**
 * A connection to the thread other than the one holding the only cache so far: new ones (each
 * creating a cache, kept on its thread) until a create lands there.
 */
async function otherThread(srv: ServerProcess, conns: Deno.Conn[]): Promise<Deno.Conn> {
  const home = (await cachesPerThread(srv.url)).indexOf(1);
  for (let i = 0; i < 40; i++) {
    const c = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
    conns.push(c);
    await create(c, `b${i}`);
    if ((await cachesPerThread(srv.url))[1 - home] > 0) return c;
  }
  throw new Error("no connection of 40 reached the other thread");
}

Deno.test("device threads serving the port: a call taken before the drain is not refused", async () => {
  const srv = await spawnServer(["--device-threads", "2", "--device-threads-http", "--no-gpu"]);
  const conns: Deno.Conn[] = [];
  try {
    const a = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
    conns.push(a);
    await create(a, "x");
    const b = await otherThread(srv, conns);
    // A forward naming `x` in its body over `b`: its thread reads the body, then passes it to
    // the front. All but the last 30 bytes now, the rest 5 bytes every 120 ms; the signal
    // 150 ms in, so the body is whole well after the drains' 100 ms settle window.
    const step = new HeldSeq().step(2);
    const body = enc.encode(JSON.stringify({ ...jsonForwardBody(step.body), kv_cache: "x" }));
    const length = { "content-length": String(body.length) };
    const req = rawRequest("POST", "/v1/attention/forward", { ...KEEP_ALIVE, ...length }, body);
    const tail = req.length - 30;
    await b.write(req.subarray(0, tail));
    const upload = (async () => {
      for (let i = tail; i < req.length; i += 5) {
        await sleep(120);
        await b.write(req.subarray(i, i + 5));
      }
    })();
    await sleep(150);
    srv.kill("SIGTERM");
    await upload;
    const r = await answerOn(b);
    assert.equal(r.status, 200, r.text);
    const out = decodeJsonAnswer(JSON.parse(r.text)).output.values;
    assert.ok(maxAbsDiff(out, step.ref) < 2e-5);
    const e = await srv.exited;
    assert.equal(e.code, 0, e.stderr);
    assert.match(e.stderr, /stopped: every call finished/);
  } finally {
    conns.forEach((c) => c.close());
    srv.kill("SIGKILL");
    await srv.exited;
  }
});
