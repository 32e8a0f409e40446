/**
 * With device threads, a request its route refuses by its head (406 for Accept, 415 for
 * Content-Type, 413 for a declared length over the JSON limit) is answered before its body is
 * read (server/head_refusal.ts), as on one thread. The device-threads front used to read every
 * forward, create and PUT body first (to find a forward's cache, or to place a create), so a
 * client uploaded the whole body for nothing, and one whose body stalled got its refusal only at
 * `--body-timeout-ms` (a black-box audit: 50-70 MB uploaded, or 1 s of stall, before a 406).
 * Each request here sends its head and the first bytes of a body it declares much longer, then
 * waits for the answer without sending the rest.
 * @module
 */
import assert from "node:assert/strict";
import { AttentionClient } from "../../client/client.ts";
import { spawnServer } from "./process.ts";
import { answerOn } from "./raw_http.ts";

/** A request whose body never comes whole: its head, then `sent` bytes of `declared`. */
async function stalled(
  port: number,
  method: string,
  path: string,
  headers: Record<string, string>,
  declared: number,
): Promise<{ status: number; code: string }> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const timer = setTimeout(() => conn.close(), 10_000);
  try {
    const head =
      `${method} ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: ${declared}\r\n` +
      Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("") + "\r\n";
    await conn.write(new TextEncoder().encode(head + '{"dtype": "float16", '));
    const r = await answerOn(conn);
    return { status: r.status, code: JSON.parse(r.text).code };
  } catch (e) {
    throw new Error(`${method} ${path}: no answer within 10 s while its body stalled (${e})`);
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch { /* closed by the timer */ }
  }
}

const CASES: [string, string, Record<string, string>, number, number, string][] = [
  [
    "POST",
    "/v1/attention/forward",
    { "content-type": "application/json", accept: "text/html" },
    100_000,
    406,
    "not_acceptable",
  ],
  [
    "POST",
    "/v1/attention/forward",
    { "content-type": "text/plain" },
    100_000,
    415,
    "unsupported_media_type",
  ],
  [
    "POST",
    "/v1/attention/forward",
    { "content-type": "application/json" },
    100_000,
    413,
    "body_too_large",
  ],
  [
    "PUT",
    "/v1/kv-caches/c1",
    { "content-type": "text/plain" },
    1000,
    415,
    "unsupported_media_type",
  ],
  ["POST", "/v1/kv-caches", { "content-type": "application/json" }, 100_000, 413, "body_too_large"],
  [
    "PUT",
    "/v1/kv-caches/c1",
    { "content-type": "application/json", "content-encoding": "gzip" },
    1000,
    415,
    "unsupported_content_encoding",
  ],
];

/** The servers' flags beside the mode: no GPU, no token, a 4 KiB JSON limit, a patient body. */
const LIMITS = [
  "--no-gpu",
  "--allow-unauthenticated",
  "--max-json-body-bytes",
  "4096",
  "--body-timeout-ms",
  "30000",
];

for (
  const mode of [["--device-threads", "2"], ["--device-threads", "2", "--device-threads-http"]]
) {
  Deno.test(`${mode.join(" ")}: refused by its head before its body is read`, async () => {
    const srv = await spawnServer([
      ...mode,
      ...LIMITS,
    ]);
    try {
      for (const [method, path, headers, declared, status, code] of CASES) {
        const got = await stalled(srv.port, method, path, headers, declared);
        assert.deepEqual(got, { status, code }, `${method} ${path} ${JSON.stringify(headers)}`);
      }
      // What is not refused by its head still goes where it goes: a create, then its GET.
      const client = new AttentionClient(srv.url);
      const spec = { num_blocks: 2, block_size: 16, num_kv_heads: 1, head_size: 8 };
      const made = await client.putCache("c2", { ...spec, dtype: "float32" });
      assert.equal(made.created, true, "201 Created");
      assert.equal((await client.getCache("c2")).id, "c2");
    } finally {
      srv.kill("SIGTERM");
      await srv.exited;
    }
  });
}

for (const mode of [["--device-threads", "2"], ["--http-workers", "1"]]) {
  Deno.test(`${mode.join(" ")}: a chunked JSON body over the JSON limit is a 413 at once`, async () => {
    // The passing thread read up to the general limit (a review: a 408 at --body-timeout-ms
    // where one thread answered 413 in 7 ms); it reads up to JSON's now (request_sender.ts).
    const srv = await spawnServer([
      ...mode,
      ...LIMITS,
    ]);
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
    const timer = setTimeout(() => conn.close(), 10_000);
    try {
      const chunk = '{"pad": "' + "x".repeat(5000);
      const head = "POST /v1/attention/forward HTTP/1.1\r\nhost: 127.0.0.1\r\n" +
        "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n" +
        `${chunk.length.toString(16)}\r\n${chunk}\r\n`;
      await conn.write(new TextEncoder().encode(head)); // and no more: the body stalls
      const r = await answerOn(conn);
      assert.equal(r.status, 413, r.text);
      const doc = JSON.parse(r.text);
      assert.equal(doc.code, "body_too_large");
      assert.equal(doc.max_json_body_bytes, 4096, r.text);
    } finally {
      clearTimeout(timer);
      try {
        conn.close();
      } catch { /* closed by the timer */ }
      srv.kill("SIGTERM");
      await srv.exited;
    }
  });
}
