/**
 * What the fuzz tests share (fuzz_test.ts, device_threads_fuzz_test.ts): sending a hostile
 * request (a lying Content-Length over a raw connection, anything else with fetch), the checks on
 * every answer (no 5xx but a 503 device_unavailable with Retry-After; every error a problem
 * document without a stack trace), and a cache's bytes for the unchanged-cache checks.
 * @module
 */
import assert from "node:assert/strict";
import type { FuzzRequest } from "./fuzz_gen.ts";
import { rawExchange, rawRequest } from "./raw_http.ts";

/** Where the requests go. */
export interface FuzzTarget {
  url: string;
  port: number;
}

/** A server-held cache's contents (its safetensors file). */
export async function cacheBytes(srv: FuzzTarget, id: string): Promise<Uint8Array> {
  const res = await fetch(`${srv.url}/v1/kv-caches/${id}/data`);
  assert.equal(res.status, 200);
  return new Uint8Array(await res.arrayBuffer());
}

/** Byte-equal. */
export const same = (a: Uint8Array, b: Uint8Array): boolean =>
  a.length === b.length && a.every((x, i) => x === b[i]);

/** An answer as the checks read it. */
export interface Answer {
  status: number;
  headers: Headers | Map<string, string>;
  text: string;
}

/** Sends one hostile request (a lying Content-Length over a raw connection). */
export async function send(srv: FuzzTarget, q: FuzzRequest): Promise<Answer> {
  if (q.lyingLength !== undefined) {
    const req = rawRequest(q.method, q.path, {
      ...q.headers,
      "content-length": String(q.lyingLength),
    }, q.body);
    const r = await rawExchange(srv.port, req);
    assert.ok(r, `${q.kind}: no answer to a body shorter than its Content-Length`);
    return r;
  }
  const res = await fetch(`${srv.url}${q.path}`, {
    method: q.method,
    headers: q.headers,
    body: q.body as Uint8Array<ArrayBuffer> | undefined,
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** The checks on every answer (see the module doc). */
export function checkAnswer(q: FuzzRequest, a: Answer, where: string): void {
  if (a.status >= 500) {
    assert.equal(a.status, 503, `${where}: ${a.status} ${a.text}`);
    assert.equal(JSON.parse(a.text).code, "device_unavailable", `${where}: ${a.text}`);
    assert.ok(Number(a.headers.get("retry-after")) > 0, `${where}: 503 without Retry-After`);
  }
  if (a.status < 400) return;
  assert.equal(a.headers.get("content-type"), "application/problem+json", `${where}: ${a.status}`);
  if (q.method === "HEAD") return assert.equal(a.text, "", `${where}: HEAD with a body`);
  const doc = JSON.parse(a.text);
  for (const k of ["type", "title", "detail", "code"]) {
    assert.equal(typeof doc[k], "string", `${where}: ${k} in ${a.text.slice(0, 300)}`);
  }
  assert.equal(doc.status, a.status, where);
  assert.doesNotMatch(a.text, /\\n\s+at /, `${where}: stack trace`);
}
