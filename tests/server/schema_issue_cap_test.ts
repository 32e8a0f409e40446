/**
 * A body refused by its schema lists at most MAX_LISTED_ISSUES issues (wire/zod_issues.ts) and
 * counts the rest in its detail. An audit's body of 4,000,000 unknown keys (43 MB, within the body
 * and value limits) was answered with 254 MB of issues, one a key, after 28 s of the serving
 * thread (/healthz waited as long) and 2 GB of memory. On a real port, both routes that take a
 * JSON body through a strict schema.
 * @module
 */
import assert from "node:assert/strict";
import { MAX_LISTED_ISSUES } from "../../core/errors.ts";
import { startServer } from "./helpers.ts";

/** `{head_size: 128, dtype: "float16"}` and `n` unknown keys "0", "1", ... */
function manyKeys(n: number): string {
  const parts = ['{"head_size":128,"dtype":"float16"'];
  for (let i = 0; i < n; i++) parts.push(`,"${i}":0`);
  return parts.join("") + "}";
}

Deno.test("schema issues: a body of 200,000 unknown keys lists 100 issues and counts the rest in one more", async () => {
  const srv = await startServer();
  try {
    for (const path of ["/v1/backends/select", "/v1/attention/forward"]) {
      const n = 200_000;
      const res = await fetch(`${srv.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: manyKeys(n),
      });
      const text = await res.text();
      assert.equal(res.status, 400, `${path}: ${text.slice(0, 300)}`);
      const doc = JSON.parse(text);
      assert.equal(doc.code, "invalid_request", path);
      assert.equal(doc.issues.length, MAX_LISTED_ISSUES + 1, path);
      const last = doc.issues[MAX_LISTED_ISSUES];
      assert.deepEqual(last.path, [], path);
      assert.match(last.message, /^\d+ more issues not listed$/, path);
      const key0 = doc.issues.find((i: { path: string[] }) => i.path[0] === "0");
      assert.match(key0?.message ?? "", /unknown field "0"; got 0/, path);
      // The forward schema also misses its required fields: those issues count too.
      const more = Number(/\(and (\d+) more\)/.exec(doc.detail)?.[1]);
      assert.ok(more >= n - 1, `${path}: ${doc.detail}`);
      assert.ok(text.length < 64 * 1024, `${path}: ${text.length} bytes`);
    }
  } finally {
    await srv.close();
  }
});
