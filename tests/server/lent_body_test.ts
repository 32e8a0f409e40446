/**
 * Answers whose body is lent host memory (server/lent_body.ts) over a real port: the memory is
 * released only after Deno.serve delivered the body to a slow client, not when the body's
 * stream ended (Deno writes the chunks it took without copying them: a buffer reused at the
 * stream's end is what a slow client would receive, as the control shows); the parts go out
 * in order with their Content-Length; a consumer that copies releases after its copy; an
 * answer nobody claims is never released (safe by default).
 */
import assert from "node:assert/strict";
import {
  lentBodyResponse,
  releaseWhenDelivered,
  serveLentBodies,
  takeLentBytes,
} from "../../server/lent_body.ts";

const BIG = 48 * 2 ** 20; // more than loopback socket buffers hold

function pattern(n: number, seed: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i += 4096) b[i] = (i / 4096 + seed) & 0xff;
  b[n - 1] = 0x5a;
  return b;
}

/** GETs `/` over raw TCP, waiting `delayMs` before reading anything; returns the body. */
async function slowGet(port: number, delayMs: number): Promise<Uint8Array> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  try {
    await conn.write(
      new TextEncoder().encode("GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    );
    await new Promise((r) => setTimeout(r, delayMs));
    const chunks: Uint8Array[] = [];
    const buf = new Uint8Array(1 << 20);
    for (;;) {
      const n = await conn.read(buf);
      if (n === null) break;
      chunks.push(buf.slice(0, n));
    }
    const all = new Uint8Array(chunks.reduce((s, c) => s + c.length, 0));
    let o = 0;
    for (const c of chunks) all.set(c, (o += c.length) - c.length);
    const head = new TextDecoder().decode(all.subarray(0, 2048));
    const end = head.indexOf("\r\n\r\n");
    assert.ok(end > 0 && head.startsWith("HTTP/1.1 200"), head.slice(0, 200));
    return all.subarray(end + 4);
  } finally {
    try {
      conn.close();
    } catch { /* closed */ }
  }
}

function same(got: Uint8Array, want: Uint8Array): string | null {
  if (got.length !== want.length) return `length ${got.length} != ${want.length}`;
  for (let i = 0; i < got.length; i++) {
    if (got[i] !== want[i]) return `byte ${i}: ${got[i]} != ${want[i]}`;
  }
  return null;
}

Deno.test("lent body: released after Deno.serve delivered it to a slow client, intact", async () => {
  const head = new TextEncoder().encode("header:");
  const data = pattern(BIG, 3);
  const want = new Uint8Array(head.length + BIG);
  want.set(head);
  want.set(data, head.length);
  let released = 0;
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    serveLentBodies(() =>
      Promise.resolve(lentBodyResponse([head, data], () => {
        released++;
        data.fill(0xee); // what reuse by the next answer would do
      }, { headers: { "content-type": "application/octet-stream" } }))
    ),
  );
  try {
    const got = await slowGet(server.addr.port, 400);
    assert.equal(same(got, want), null, "the client received memory reused before delivery");
    for (let i = 0; i < 50 && released === 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(released, 1, "the lent memory was not released after delivery");
  } finally {
    await server.shutdown();
  }
});

Deno.test("lent body (control): reusing the memory when the stream ends corrupts a slow client's body", async () => {
  const data = pattern(BIG, 5);
  const want = data.slice();
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, () => {
    let sent = false;
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        if (!sent) {
          sent = true;
          c.enqueue(data);
        } else {
          c.close();
          data.fill(0xee); // the stream ended: too early to reuse
        }
      },
    }, { highWaterMark: 0 });
    return new Response(body, { headers: { "content-length": String(BIG) } });
  });
  try {
    const got = await slowGet(server.addr.port, 400);
    assert.notEqual(same(got, want), null, "Deno copied the chunk: the stream's end would be safe");
  } finally {
    await server.shutdown();
  }
});

Deno.test("lent body: parts in order with Content-Length; a copying consumer releases after its copy", async () => {
  const parts = [new Uint8Array([1, 2, 3]), new Uint8Array([4, 5]), new Uint8Array(0)];
  let released = 0;
  const res = lentBodyResponse(parts, () => released++, { headers: { "x-a": "b" } });
  assert.equal(res.headers.get("content-length"), "5");
  assert.equal(res.headers.get("x-a"), "b");
  const copy = res.arrayBuffer();
  releaseWhenDelivered(res, copy);
  assert.deepEqual([...new Uint8Array(await copy)], [1, 2, 3, 4, 5]);
  await Promise.resolve();
  assert.equal(released, 1);
  releaseWhenDelivered(res, Promise.resolve()); // claimed once: no second release
  await Promise.resolve();
  assert.equal(released, 1);
});

Deno.test("lent body: takeLentBytes copies the parts once and releases at once", async () => {
  let released = 0;
  const parts = [new Uint8Array([1, 2, 3]), new Uint8Array(0), new Uint8Array([4, 5])];
  const res = lentBodyResponse(parts, () => released++, { headers: {} });
  const bytes = takeLentBytes(res);
  assert.deepEqual([...new Uint8Array(bytes!)], [1, 2, 3, 4, 5]);
  assert.equal(released, 1);
  parts[0][0] = 9; // the memory goes back to its pool: the copy must not see it
  assert.equal(new Uint8Array(bytes!)[0], 1);
  assert.equal(takeLentBytes(res), null, "taken once");
  releaseWhenDelivered(res, Promise.resolve());
  await Promise.resolve();
  assert.equal(released, 1, "no second release");
  assert.equal(takeLentBytes(new Response("x")), null, "not lent");
  const read = lentBodyResponse([new Uint8Array(4)], () => released++, { headers: {} });
  await read.arrayBuffer();
  assert.equal(takeLentBytes(read), null, "its body was read already");
});

Deno.test("lent body: an answer nobody claims is never released, even once read", async () => {
  let released = 0;
  const res = lentBodyResponse([new Uint8Array(8)], () => released++, { headers: {} });
  assert.equal((await res.bytes()).length, 8);
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(released, 0);
});

/** curl speaks HTTP/2 without TLS (`--http2-prior-knowledge`); fetch cannot. */
const CURL = (() => {
  try {
    return new Deno.Command("curl", { args: ["--version"], stdout: "null" }).outputSync().success;
  } catch {
    return false;
  }
})();

Deno.test({
  name: `lent body: released after an HTTP/1.1 answer, never after an HTTP/2 (h2c) one${
    CURL ? "" : " (skipped: no curl on this machine for the h2c request)"
  }`,
  ignore: !CURL,
}, async () => {
  let released = 0;
  const server = Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen() {} },
    serveLentBodies(() =>
      Promise.resolve(
        lentBodyResponse([new Uint8Array([7, 8, 9])], () => released++, { headers: {} }),
      )
    ),
  );
  const curl = async (http2: boolean) => {
    const args = ["-s", ...(http2 ? ["--http2-prior-knowledge"] : []), "-o", "-"];
    const out = await new Deno.Command("curl", {
      args: [...args, `http://127.0.0.1:${server.addr.port}/`],
      stdout: "piped",
    }).output();
    assert.ok(out.success, "curl failed");
    assert.deepEqual([...out.stdout], [7, 8, 9]);
  };
  const settle = () => new Promise((r) => setTimeout(r, 50));
  try {
    await curl(true);
    await settle();
    assert.equal(released, 0, "HTTP/2 answer's memory was released for reuse");
    await curl(false);
    await settle();
    assert.equal(released, 1, "HTTP/1.1 answer's memory was not released");
  } finally {
    await server.shutdown();
  }
});
