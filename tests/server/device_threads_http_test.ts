/**
 * `--device-threads 2 --device-threads-http` end to end, on a real server process (`--no-gpu`:
 * each thread's service runs CPU_REFERENCE): the threads serve the port themselves; caches
 * created over one keep-alive connection all land on the thread that connection reached (the
 * origin preference: without it they would spread over both threads); calls on them, by the
 * path route and by a JSON and a safetensors body naming the cache, match float64; a cache
 * held by the other thread is reached from the same connection through the front; each call
 * is counted once in the merged /metrics; answers carry the instance name wherever they are
 * answered; SIGTERM drains and exits 0, waiting for a call in flight on a device thread (an
 * upload to a cache that thread holds) and counting that wait in its "every call finished"
 * time; the flag needs `--device-threads`.
 */
import assert from "node:assert/strict";
import { HttpConn, type RawAnswer, rawRequest } from "../../bench/http_conn.ts";
import { answerOn, rawRequest as rawBytes } from "./raw_http.ts";
import {
  decodeJsonAnswer,
  decodeSafetensorsAnswer,
  forwardBodyToSafetensors,
  jsonForwardBody,
} from "../../wire/client_codec.ts";
import type { ForwardBody } from "../../client/client.ts";
import { HeldSeq } from "./held_seq.ts";
import { maxAbsDiff } from "./helpers.ts";
import { runServerToExit, spawnServer } from "./process.ts";

const enc = new TextEncoder();
const JSON_TYPE = { "content-type": "application/json" };

/** attn_kv_caches per device thread, from the merged /metrics. */
async function cachesPerThread(url: string): Promise<number[]> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = [0, 0];
  for (const m of text.matchAll(/^attn_kv_caches\{device_thread="(\d+)"\} (\d+)$/gm)) {
    out[Number(m[1])] = Number(m[2]);
  }
  return out;
}

/** Forward calls counted in the merged /metrics (every route, status and thread). */
async function forwardsCounted(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return [...text.matchAll(/^attn_http_requests_total\{([^}]*)\} (\d+)$/gm)]
    .filter((m) => /route="[^"]*forward"/.test(m[1]))
    .reduce((a, m) => a + Number(m[2]), 0);
}

function ok(a: RawAnswer, what: string): RawAnswer {
  assert.ok(a.status < 300, `${what}: ${a.status} ${new TextDecoder().decode(a.body)}`);
  return a;
}

/** Three steps on cache `id` over `conn` (path route, JSON body, safetensors body). */
async function stepsOn(conn: HttpConn, url: string, id: string, seq: HeldSeq): Promise<void> {
  const json = (b: ForwardBody) => enc.encode(JSON.stringify(jsonForwardBody(b)));
  const a = seq.step(3);
  const r1 = ok(
    await conn.send(
      rawRequest("POST", `${url}/v1/kv-caches/${id}/forward`, JSON_TYPE, json(a.body)),
    ),
    `${id}: path route`,
  );
  assert.equal(r1.headers.get("x-attention-instance"), "inst-7", `${id}: the instance header`);
  const out1 = decodeJsonAnswer(JSON.parse(new TextDecoder().decode(r1.body))).output.values;
  assert.ok(maxAbsDiff(out1, a.ref) < 2e-5, `${id}: path route`);
  const b = seq.step(1);
  const r2 = ok(
    await conn.send(
      rawRequest(
        "POST",
        `${url}/v1/attention/forward`,
        JSON_TYPE,
        json({ ...b.body, kv_cache: id }),
      ),
    ),
    `${id}: JSON body`,
  );
  const out2 = decodeJsonAnswer(JSON.parse(new TextDecoder().decode(r2.body))).output.values;
  assert.ok(maxAbsDiff(out2, b.ref) < 2e-5, `${id}: JSON body naming the cache`);
  const c = seq.step(2);
  const r3 = ok(
    await conn.send(rawRequest("POST", `${url}/v1/attention/forward`, {
      "content-type": "application/octet-stream",
      accept: "application/octet-stream",
    }, forwardBodyToSafetensors({ ...c.body, kv_cache: id }))),
    `${id}: safetensors body`,
  );
  const out3 = decodeSafetensorsAnswer(r3.body).output.values;
  assert.ok(maxAbsDiff(out3, c.ref) < 2e-5, `${id}: safetensors body naming the cache`);
}

const spec = () => enc.encode(JSON.stringify(HeldSeq.cacheSpec()));

Deno.test("device threads serving the port: caches stay on their connection's thread", async () => {
  const srv = await spawnServer([
    "--device-threads",
    "2",
    "--device-threads-http",
    "--no-gpu",
    "--instance-name",
    "inst-7",
  ]);
  const conns: HttpConn[] = [];
  const open = () => {
    const c = new HttpConn(srv.url);
    conns.push(c);
    return c;
  };
  try {
    const a = open();
    for (const id of ["a1", "a2", "a3"]) {
      ok(await a.send(rawRequest("PUT", `${srv.url}/v1/kv-caches/${id}`, JSON_TYPE, spec())), id);
    }
    const posted = ok(
      await a.send(rawRequest("POST", `${srv.url}/v1/kv-caches`, JSON_TYPE, spec())),
      "POST create",
    );
    const postedId = JSON.parse(new TextDecoder().decode(posted.body)).id as string;
    const perThread = await cachesPerThread(srv.url);
    const home = perThread.indexOf(4);
    assert.ok(home >= 0, `all four on the connection's thread: ${perThread}`);
    // A connection that reached the other thread: new ones until a create lands there (the
    // creates of connections that reached thread `home` stay there).
    let b: HttpConn | null = null, bOwn = "";
    for (let i = 0; i < 40 && !b; i++) {
      const c = open();
      const id = `b${i}`;
      ok(await c.send(rawRequest("PUT", `${srv.url}/v1/kv-caches/${id}`, JSON_TYPE, spec())), id);
      if ((await cachesPerThread(srv.url))[1 - home] > 0) [b, bOwn] = [c, id];
    }
    assert.ok(b, "no connection of 40 reached the other thread");
    assert.equal((await cachesPerThread(srv.url))[1 - home], 1);
    const before = await forwardsCounted(srv.url);
    // Local calls, and each connection on a cache of the other thread (through the front).
    const seqs = new Map<string, HeldSeq>();
    const seq = (id: string) => seqs.get(id) ?? seqs.set(id, new HeldSeq()).get(id)!;
    for (const id of ["a1", "a2", postedId]) await stepsOn(a, srv.url, id, seq(id));
    await stepsOn(a, srv.url, bOwn, seq(bOwn));
    await stepsOn(b, srv.url, "a3", seq("a3"));
    await stepsOn(b, srv.url, bOwn, seq(bOwn));
    assert.equal(await forwardsCounted(srv.url) - before, 6 * 3, "each call counted once");
    // A delete over the other thread's connection frees the cache on its holder.
    const held = (await cachesPerThread(srv.url))[home];
    ok(
      await b.send(rawRequest("DELETE", `${srv.url}/v1/kv-caches/a3`, {}, new Uint8Array())),
      "del",
    );
    assert.equal((await cachesPerThread(srv.url))[home], held - 1);
    const gone = await a.send(
      rawRequest("GET", `${srv.url}/v1/kv-caches/a3`, {}, new Uint8Array()),
    );
    assert.equal(gone.status, 404);
    conns.forEach((c) => c.close());
    srv.kill("SIGTERM");
    const end = await srv.exited;
    assert.equal(end.code, 0, end.stderr);
    assert.match(end.stderr, /stopped: every call finished/);
    assert.match(end.stderr, /device threads serve the port: 2/);
  } finally {
    conns.forEach((c) => c.close());
    srv.kill("SIGKILL");
    await srv.exited;
  }
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

Deno.test("device threads serving the port: SIGTERM waits for a call on a device thread", async () => {
  const srv = await spawnServer(["--device-threads", "2", "--device-threads-http", "--no-gpu"]);
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
  try {
    // Created over this connection, the cache is on the thread that serves it (the origin
    // preference), so a call on it over the same connection stays on that thread.
    const keepAlive = { "content-type": "application/json", connection: "keep-alive" };
    const created = spec();
    const length = { "content-length": String(created.length) };
    await conn.write(rawBytes("PUT", "/v1/kv-caches/up", { ...keepAlive, ...length }, created));
    assert.equal((await answerOn(conn)).status, 201);
    const seq = new HeldSeq();
    const step = seq.step(2);
    const body = enc.encode(JSON.stringify(jsonForwardBody(step.body)));
    const req = rawBytes("POST", "/v1/kv-caches/up/forward", {
      ...keepAlive,
      "content-length": String(body.length),
    }, body);
    // All but the last 30 bytes now, the rest 5 bytes every 120 ms; the signal 150 ms in.
    const tail = req.length - 30;
    await conn.write(req.subarray(0, tail));
    const upload = (async () => {
      for (let i = tail; i < req.length; i += 5) {
        await sleep(120);
        await conn.write(req.subarray(i, i + 5));
      }
    })();
    await sleep(150);
    const signalled = performance.now();
    srv.kill("SIGTERM");
    await upload;
    const uploaded = performance.now() - signalled;
    const r = await answerOn(conn);
    assert.equal(r.status, 200, r.text);
    const out = decodeJsonAnswer(JSON.parse(r.text)).output.values;
    assert.ok(maxAbsDiff(out, step.ref) < 2e-5);
    const end = await srv.exited;
    assert.equal(end.code, 0, end.stderr);
    // The call was the thread's alone, counted there (this thread's drainer never had it).
    assert.match(
      end.stderr,
      /SIGTERM: stopping; finishing 1 calls in flight on the device threads \(deadline \d+ ms\)/,
    );
    const ms = Number(/stopped: every call finished \((\d+) ms[;)]/.exec(end.stderr)?.[1]);
    assert.ok(ms >= uploaded - 100, `the stop took ${ms} ms, the upload ${uploaded} ms after it`);
  } finally {
    conn.close();
    srv.kill("SIGKILL");
    await srv.exited;
  }
});

Deno.test("device threads serving the port: needs --device-threads", async () => {
  const r = await runServerToExit(["--device-threads-http", "--no-gpu"]);
  assert.equal(r.code, 2);
  assert.match(
    r.stderr,
    /--device-threads-http needs --device-threads N \(or ATTN_DEVICE_THREADS\) with N >= 1, got 0 \(the default\)/,
  );
});
