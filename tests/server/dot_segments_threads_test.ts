/**
 * Paths are matched as sent (docs/api.md), in every serving mode: a path with dot segments,
 * percent-encoded dots or backslashes reaches no cache. Under `--device-threads` the front passed
 * such a request on with its *resolved* URL (a rebuilt Request's `url`), so the thread that held
 * `/v1/kv-caches/zzz/../victim` served or deleted `victim`, and a PUT through it created a second
 * cache of an existing id (a black-box audit, with `--device-threads-http` and with
 * `--http-engine http1`). Each mode must answer each such request as one thread does and leave
 * every cache as it was.
 */
import assert from "node:assert/strict";
import { spawnServer } from "./process.ts";
import { rawExchange, rawRequest } from "./raw_http.ts";

const SPEC = { num_blocks: 2, block_size: 16, num_kv_heads: 1, head_size: 8, dtype: "float32" };
const IDS = ["vict0", "vict1", "vict2", "vict3", "vict4", "vict5"];

const targets = (id: string) => [
  ["GET", `/v1/kv-caches/zzz/../${id}`],
  ["GET", `/v1/kv-caches/./${id}`],
  ["GET", `/x/%2e%2e/v1/kv-caches/${id}`],
  ["GET", `/v1/kv-caches/zzz/%2E%2E/${id}/data`],
  ["GET", `/v1\\kv-caches\\${id}`],
  ["DELETE", `/v1/kv-caches/zzz/../${id}`],
  ["PUT", `/v1/kv-caches/zzz/../${id}`],
];

/** Each odd request's status, in order, on a server started with `mode`; caches checked after. */
async function answers(mode: string[]): Promise<string[]> {
  const srv = await spawnServer(["--no-gpu", ...mode]);
  try {
    const json = (spec: object) => {
      const body = JSON.stringify(spec);
      return { "content-type": "application/json", "content-length": String(body.length), body };
    };
    const put = (target: string, spec: object) => {
      const { body, ...h } = json(spec);
      return rawRequest("PUT", target, h, body);
    };
    for (const id of IDS) {
      const r = await rawExchange(srv.port, put(`/v1/kv-caches/${id}`, SPEC));
      assert.equal(r?.status, 201, r?.text);
    }
    const seen: string[] = [];
    for (const id of IDS) {
      for (const [method, target] of targets(id)) {
        const req = method === "PUT"
          ? put(target, { ...SPEC, num_blocks: 3 })
          : `${method} ${target} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n`;
        const r = await rawExchange(srv.port, req);
        seen.push(`${method} ${target.replace(id, "ID")}: ${r?.status}`);
      }
    }
    // Every cache as created, once: its spec (not a PUT's through dot segments), then gone.
    for (const id of IDS) {
      const r = await rawExchange(srv.port, rawRequest("GET", `/v1/kv-caches/${id}`, {}));
      assert.equal(r?.status, 200, `${mode}: ${id}: ${r?.text}`);
      assert.equal(JSON.parse(r!.text).num_blocks, 2, `${mode}: ${id} replaced: ${r!.text}`);
      const d = await rawExchange(srv.port, rawRequest("DELETE", `/v1/kv-caches/${id}`, {}));
      assert.equal(d?.status, 204, d?.text);
      const g = await rawExchange(srv.port, rawRequest("GET", `/v1/kv-caches/${id}`, {}));
      assert.equal(g?.status, 404, `${mode}: ${id} still there after its DELETE: ${g?.text}`);
    }
    return seen;
  } finally {
    srv.kill("SIGKILL");
    await srv.exited;
  }
}

Deno.test("dot segments: every serving mode answers them as one thread does", async () => {
  const one = await answers([]);
  assert.ok(one.every((s) => !/: 2\d\d$/.test(s)), `one thread served one: ${one.join("; ")}`);
  for (
    const mode of [
      ["--device-threads", "2"],
      ["--device-threads", "2", "--device-threads-http"],
      ["--device-threads", "2", "--http-engine", "http1"],
      ["--http-workers", "2", "--http-engine", "http1"],
      ["--http-engine", "http1"],
    ]
  ) {
    assert.deepEqual(await answers(mode), one, mode.join(" "));
  }
});
