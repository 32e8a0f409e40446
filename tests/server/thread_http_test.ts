/**
 * A device thread's own listener (server/thread_http.ts, `--device-threads-http`) in process:
 * which requests its handler answers itself and which go to the front, on a real port. The
 * "thread" here is this isolate: a handler that says it answered, a cache set it holds, and a
 * front behind a RequestSender and RequestOwner pair (the messages a MessagePort would carry),
 * whose handler says it answered and echoes what it got. A call naming a held cache (JSON body
 * and safetensors body, path route, GET) stays local with its body intact; creates carry the
 * origin header, deletes and other threads' caches go to the front with their bodies intact.
 */
import assert from "node:assert/strict";
import { forwardBodyToSafetensors } from "../../wire/client_codec.ts";
import { RequestOwner } from "../../server/request_owner.ts";
import { RequestSender } from "../../server/request_sender.ts";
import { ORIGIN_HEADER, serveThreadHttp } from "../../server/thread_http.ts";
import { scanWorker } from "../../server/forward_cache_id.ts";
import { HeldSeq } from "./held_seq.ts";

interface Seen {
  where: "local" | "front";
  method: string;
  path: string;
  origin: string | null;
  bytes: number[];
}

async function echo(where: Seen["where"], req: Request): Promise<Response> {
  const bytes = req.body ? [...new Uint8Array(await req.arrayBuffer())] : [];
  const seen: Seen = {
    where,
    method: req.method,
    path: new URL(req.url).pathname,
    origin: req.headers.get(ORIGIN_HEADER),
    bytes,
  };
  return Response.json(seen);
}

Deno.test("thread listener: its own caches here, the rest to the front", async () => {
  const held = new Set(["mine", "sp ace"]);
  const ends: { owner?: RequestOwner } = {};
  const front = new RequestSender(
    (m, t) => {
      queueMicrotask(() => {
        const o = structuredClone(m, { transfer: t ?? [] });
        if (o.type === "head") ends.owner!.head(o);
        else if (o.type === "body") ends.owner!.body(o);
        else if (o.type === "abort") ends.owner!.abort(o.id);
      });
    },
    1 << 26,
    () => true,
  );
  ends.owner = new RequestOwner(
    (m, t) => queueMicrotask(() => front.receive(structuredClone(m, { transfer: t }))),
    (req) => echo("front", req),
    () => {},
  );
  const scans = scanWorker();
  let counted = 0;
  const server = serveThreadHttp({
    index: 3,
    port: 0,
    hostname: "127.0.0.1",
    token: "tok",
    handler: (req) => echo("local", req),
    holds: (id) => held.has(id),
    wrap: (h) => (req) => (counted++, h(req)),
    front,
    scans,
    onListen: () => {},
    log: () => {},
  });
  const url = `http://127.0.0.1:${server.addr.port}`;
  const call = async (
    method: string,
    path: string,
    body?: Uint8Array<ArrayBuffer> | string,
    type?: string,
  ) => {
    const headers = type ? { "content-type": type } : undefined;
    const res = await fetch(`${url}${path}`, { method, body, headers });
    assert.equal(res.status, 200, `${method} ${path}`);
    return await res.json() as Seen;
  };
  try {
    const step = new HeldSeq().step(2).body;
    const json = (id: string) => JSON.stringify({ ...step, kv_cache: id });
    const st = (id: string) =>
      forwardBodyToSafetensors({ ...step, kv_cache: id }) as Uint8Array<ArrayBuffer>;
    const enc = new TextEncoder();
    const cases: [
      string,
      string,
      Uint8Array<ArrayBuffer> | string | undefined,
      string | undefined,
      string,
    ][] = [
      ["POST", "/v1/attention/forward", json("mine"), "application/json", "local"],
      ["POST", "/v1/attention/forward", st("mine"), "application/octet-stream", "local"],
      ["POST", "/v1/attention/forward", json("theirs"), "application/json", "front"],
      ["POST", "/v1/attention/forward", st("theirs"), "application/octet-stream", "front"],
      ["POST", "/v1/attention/forward", "{not json", "application/json", "front"],
      ["POST", "/v1/kv-caches/mine/forward", json("x"), "application/json", "local"],
      ["POST", "/v1/kv-caches/sp%20ace/forward", json("x"), "application/json", "local"],
      ["POST", "/v1/kv-caches/theirs/forward", json("x"), "application/json", "front"],
      ["GET", "/v1/kv-caches/mine", undefined, undefined, "local"],
      ["GET", "/v1/kv-caches/theirs", undefined, undefined, "front"],
      ["DELETE", "/v1/kv-caches/mine", undefined, undefined, "front"],
      ["PUT", "/v1/kv-caches/mine", "{}", "application/json", "front"],
      ["PUT", "/v1/kv-caches/theirs/data", "xy", "application/octet-stream", "front"],
      ["PUT", "/v1/kv-caches/mine/data", "xy", "application/octet-stream", "local"],
      ["POST", "/v1/kv-caches", "{}", "application/json", "front"],
      ["GET", "/metrics", undefined, undefined, "front"],
      ["GET", "/healthz", undefined, undefined, "front"],
    ];
    for (const [method, path, body, type, where] of cases) {
      const seen = await call(method, path, body, type);
      assert.equal(seen.where, where, `${method} ${path} ${String(body).slice(0, 20)}`);
      assert.equal(seen.method, method);
      const sent = body === undefined
        ? []
        : [...(typeof body === "string" ? enc.encode(body) : body)];
      assert.deepEqual(seen.bytes, sent, `${method} ${path}: the body as sent`);
      const create = (method === "PUT" && path === "/v1/kv-caches/mine") ||
        (method === "POST" && path === "/v1/kv-caches");
      assert.equal(seen.origin, create ? "3 tok" : null, `${method} ${path}: origin`);
    }
    assert.equal(counted, cases.length, "every request through the wrapper (the drainer)");
  } finally {
    await server.shutdown();
    scans.close();
  }
});
