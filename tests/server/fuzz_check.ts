/**
 * What the fuzz tests share (fuzz_test.ts, device_threads_fuzz_test.ts): sending a hostile
 * request (a lying Content-Length over a raw connection, anything else with fetch), the checks on
 * every answer (no 5xx but a 503 device_unavailable, without Retry-After where it says
 * `retryable: false`, the no-device servers here, with it otherwise; every error a problem
 * document without a stack trace), and a cache's bytes for the unchanged-cache checks.
 * @module
 */
import assert from "node:assert/strict";
import { type FuzzRequest, hostileRequest, TARGET, validForward } from "./fuzz_gen.ts";
import type { AttentionClient } from "../../client/client.ts";
import type { Rng } from "../support/rng.ts";
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
    const doc = JSON.parse(a.text);
    assert.equal(doc.code, "device_unavailable", `${where}: ${a.text}`);
    if (doc.retryable === false) {
      assert.equal(a.headers.get("retry-after"), null, `${where}: Retry-After, not retryable`);
    } else {
      assert.ok(Number(a.headers.get("retry-after")) > 0, `${where}: 503 without Retry-After`);
    }
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

/** Counts of what a run answered: statuses, and problem codes. */
export interface FuzzTally {
  statuses: Map<number, number>;
  codes: Map<string, number>;
}

/**
 * Sends `count` hostile requests aimed at cache `target`, checks each answer, and checks that
 * every rejected call on the target left its bytes as they were; then that the `witnesses`
 * (caches no request names) are byte-identical to before.
 */
export async function fuzzRun(
  srv: FuzzTarget,
  r: Rng,
  o: { target: string; witnesses: string[]; count: number; seed: number },
): Promise<FuzzTally> {
  const before = await Promise.all(o.witnesses.map((w) => cacheBytes(srv, w)));
  let targetBytes = await cacheBytes(srv, o.target);
  const tally: FuzzTally = { statuses: new Map(), codes: new Map() };
  for (let i = 0; i < o.count; i++) {
    const q = hostileRequest(r, o.target);
    const where = `request ${i} (${q.kind} ${q.method} ${q.path.slice(0, 60)}; SEED=${o.seed})`;
    const a = await send(srv, q);
    tally.statuses.set(a.status, (tally.statuses.get(a.status) ?? 0) + 1);
    checkAnswer(q, a, where);
    if (a.status >= 400 && q.method !== "HEAD") {
      const code = JSON.parse(a.text).code;
      tally.codes.set(code, (tally.codes.get(code) ?? 0) + 1);
    }
    if (q.targetsCache) {
      const now = await cacheBytes(srv, o.target);
      if (a.status >= 400) {
        assert.ok(same(now, targetBytes), `${where}: rejected, yet changed the target cache`);
      }
      targetBytes = now;
    }
  }
  const after = await Promise.all(o.witnesses.map((w) => cacheBytes(srv, w)));
  o.witnesses.forEach((w, i) => assert.ok(same(before[i], after[i]), `witness ${w} changed`));
  return tally;
}

/**
 * The caches a fuzz run needs, each written once by a valid call: the target (f32) and three
 * witnesses no request names (f32 NHD, f16 HND, bf16 data over an fp8 e4m3 cache).
 */
export async function fuzzCaches(
  client: AttentionClient,
  r: Rng,
): Promise<{ target: string; witnesses: string[] }> {
  const { H, HKV, D, BS, NB } = TARGET;
  assert.equal(H % HKV, 0);
  const mk = async (dtype: string, layout = "NHD", kv = "auto") =>
    (await client.createCache({
      num_blocks: NB,
      block_size: BS,
      num_kv_heads: HKV,
      head_size: D,
      dtype: dtype as "float32",
      layout: layout as "NHD",
      kv_cache_dtype: kv as "auto",
    })).id;
  const target = await mk("float32");
  const witnesses = [
    await mk("float32"),
    await mk("float16", "HND"),
    await mk("bfloat16", "NHD", "fp8_e4m3"),
  ];
  for (const id of [target, witnesses[0]]) await client.forward(validForward(r, id));
  for (const id of witnesses.slice(1)) {
    const b = validForward(r, id);
    await client.forward({ ...b, dtype: id === witnesses[1] ? "float16" : "bfloat16" });
  }
  return { target, witnesses };
}
