/**
 * Reading request bodies (server/body_read.ts) from streams whose every pull is scripted: the
 * body comes out whole and aligned however it is chunked, with or without a declared length;
 * a declared length is followed by one more read to the stream's end (Deno answers a request
 * whose body stream is left open later), and that read failing loses nothing; memory stays
 * within 1 MiB or twice what arrived; cut-short and oversized bodies keep their problems.
 */
import assert from "node:assert/strict";
import { BodyBuffer, contentLength, readBody } from "../../server/body_read.ts";
import { ServiceError } from "../../core/errors.ts";
import { Rng } from "../support/rng.ts";

/** What a scripted stream saw. */
interface Script {
  /** Pulls made after the last chunk was handed out. */
  pullsAfterLast: number;
}

/**
 * A request whose body stream hands out `chunks` one per pull (no read-ahead), then either
 * ends or errors (`after`).
 */
function request(
  chunks: Uint8Array[],
  declared: number | null,
  after: "end" | "error" = "end",
): { req: Request; script: Script } {
  const script: Script = { pullsAfterLast: 0 };
  let i = 0;
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (i < chunks.length) return c.enqueue(chunks[i++]);
      script.pullsAfterLast++;
      if (after === "error") c.error(new Error("connection reset after the last byte"));
      else c.close();
    },
  }, { highWaterMark: 0 });
  const headers: Record<string, string> = { "content-type": "application/octet-stream" };
  if (declared !== null) headers["content-length"] = String(declared);
  return {
    req: new Request("http://x/v1/attention/forward", {
      method: "POST",
      headers,
      body,
      duplex: "half",
    } as RequestInit),
    script,
  };
}

/** `total` random bytes cut into random chunks (some views at odd offsets). */
function chunked(
  rng: Rng,
  total: number,
  maxChunk: number,
): { whole: Uint8Array; parts: Uint8Array[] } {
  const whole = new Uint8Array(total);
  for (let i = 0; i < total; i++) whole[i] = rng.int(256);
  const parts: Uint8Array[] = [];
  for (let at = 0; at < total;) {
    const n = Math.min(total - at, 1 + rng.int(maxChunk));
    const pad = rng.int(3);
    const part = new Uint8Array(n + pad).subarray(pad);
    part.set(whole.subarray(at, at + n));
    parts.push(part);
    at += n;
  }
  return { whole, parts };
}

Deno.test("body read: whole and aligned however chunked, declared or not", async () => {
  const rng = new Rng(11);
  for (const total of [0, 1, 7, 4096, 100_000, 3 * 2 ** 20 + 5]) {
    for (const declared of [true, false]) {
      const { whole, parts } = chunked(rng, total, total > 2 ** 20 ? 256 * 1024 : 5000);
      const { req } = request(parts, declared ? total : null);
      const got = await readBody(req, 2 ** 30);
      assert.equal(got.byteLength, total);
      assert.equal(got.byteOffset % 8, 0, "safetensors offsets count from an aligned start");
      assert.ok(got.every((b, i) => b === whole[i]), `${total} bytes, declared ${declared}`);
    }
  }
  // One chunk that is the whole body at an odd offset is copied to an aligned buffer.
  const odd = new Uint8Array(2 ** 21 + 3).subarray(3).fill(9);
  const got = await readBody(request([odd], null).req, 2 ** 30);
  assert.equal(got.byteOffset % 8, 0);
  assert.equal(got.byteLength, odd.byteLength);
});

Deno.test("body read: after the declared length, the stream is read to its end", async () => {
  const { whole, parts } = chunked(new Rng(3), 50_000, 8000);
  const { req, script } = request(parts, whole.byteLength);
  await readBody(req, 2 ** 20);
  assert.equal(script.pullsAfterLast, 1, "one more read found the end of the body");
});

Deno.test("body read: the read after the last declared byte failing loses nothing", async () => {
  const { whole, parts } = chunked(new Rng(4), 20_000, 3000);
  const { req, script } = request(parts, whole.byteLength, "error");
  const got = await readBody(req, 2 ** 20);
  assert.equal(script.pullsAfterLast, 1);
  assert.deepEqual(got, whole);
});

Deno.test("body read: cut short is a 400 body_incomplete, too long a 413", async () => {
  const { parts } = chunked(new Rng(5), 1000, 300);
  const cut = readBody(request(parts, 4000).req, 2 ** 20);
  await assert.rejects(cut, (e: unknown) => {
    assert.ok(e instanceof ServiceError);
    assert.equal(e.status, 400);
    assert.equal(e.code, "body_incomplete");
    assert.equal((e.extra as Record<string, unknown>).received_bytes, 1000);
    return true;
  });
  const long = readBody(request(parts, null).req, 999);
  await assert.rejects(long, (e: unknown) => e instanceof ServiceError && e.status === 413);
  const declared = readBody(request(parts, 1000).req, 999);
  await assert.rejects(declared, (e: unknown) => e instanceof ServiceError && e.status === 413);
});

Deno.test("body read: a whole body in one aligned chunk is kept, not copied", () => {
  for (const declared of [0, 1000, 430_000, 2 ** 20 + 8]) {
    const chunk = new Uint8Array(declared).fill(7);
    const b = new BodyBuffer(declared);
    b.add(chunk);
    assert.equal(b.bytes(), chunk, `declared ${declared}`);
  }
  // Not aligned to 8 bytes (safetensors offsets count from the body's start): copied.
  const odd = new Uint8Array(1004).subarray(4);
  const b = new BodyBuffer(1000);
  b.add(odd);
  assert.notEqual(b.bytes(), odd);
  assert.deepEqual(b.bytes(), odd);
});

Deno.test("body read: memory within 1 MiB at the first chunk or twice what arrived", () => {
  const rng = new Rng(6);
  for (const declared of [-1, 0, 1000, 2 ** 20, 2 ** 20 + 1, 64 * 2 ** 20]) {
    const b = new BodyBuffer(declared);
    const up = declared >= 0 && declared <= 2 ** 20 ? declared : 0;
    assert.equal(b.reserved, 0, `nothing reserved before a byte (declared ${declared})`);
    const total = declared >= 0 ? declared : 5 * 2 ** 20;
    for (let at = 0; at < total;) {
      const n = Math.min(total - at, 1 + rng.int(128 * 1024));
      b.add(new Uint8Array(n));
      at += n;
      assert.ok(
        b.reserved <= Math.max(up, 2 * b.total),
        `declared ${declared}: ${b.reserved} held for ${b.total} received`,
      );
    }
    assert.equal(b.bytes().byteLength, total);
  }
});

Deno.test("body read: Content-Length is a decimal count or nothing", () => {
  assert.equal(contentLength(null), -1);
  assert.equal(contentLength("0"), 0);
  assert.equal(contentLength(" 412345 "), 412345);
  assert.equal(contentLength("99999999999999999999"), 1e20, "huge: over every limit, not NaN");
  for (const bad of ["", " ", "-1", "1e3", "0x10", "12 34", "+5", "1.0"]) {
    assert.ok(Number.isNaN(contentLength(bad)), JSON.stringify(bad));
  }
});

Deno.test("body read: a bad Content-Length is a 400 naming it", async () => {
  const req = new Request("http://x/", {
    method: "POST",
    body: "abc",
    headers: { "content-length": "3x" },
  });
  await assert.rejects(readBody(req, 100), (e: unknown) => {
    assert.ok(e instanceof ServiceError);
    assert.equal(e.status, 400);
    assert.match(e.message, /invalid Content-Length "3x"/);
    return true;
  });
});

Deno.test("body read: a whole read takes the body in one piece, never through req.body", async () => {
  // `req.body` builds a ReadableStream; `req.bytes()` then collects through it chunk by chunk
  // (garbage per chunk) instead of Deno's one-op read. The whole read must not touch it.
  const rng = new Rng(7);
  for (const total of [0, 1, 4096, 70_000]) {
    const { whole, parts } = chunked(rng, total, 9000);
    const { req } = request(parts, total);
    let bodyReads = 0;
    const watched = new Proxy(req, {
      get(target, key) {
        if (key === "body") bodyReads++;
        const v = Reflect.get(target, key, target);
        return typeof v === "function" ? v.bind(target) : v;
      },
    });
    const got = await readBody(watched, 1 << 20, { whole: true });
    assert.deepEqual(got, whole, `${total} bytes`);
    assert.equal(got.byteOffset % 8, 0);
    assert.equal(bodyReads, 0, `req.body read ${bodyReads} times for ${total} bytes`);
  }
});
