/**
 * The body timeout (server/body_timeout.ts) and a busy thread: while the thread that reads
 * bodies is held by synchronous work longer than the limit, a client that keeps sending must
 * not get a 408 (its timers fire late, all at once, beside the bytes that came meanwhile). An
 * audit saw both reads end `timeout` after a 2.5 s step with a 1 s limit. The client is another
 * process, so the busy step does not slow it; each read's end is checked (a client that truly
 * stops still gets its 408: body_timeout_test.ts).
 */
import assert from "node:assert/strict";
import { streamBody, wholeBody } from "../../server/body_read.ts";
import { BODY_TIMEOUT_ENV, patientTimeout } from "../../server/body_timeout.ts";
import { withEnv } from "../support/env.ts";

const LIMIT_MS = 1000;

/** A client process sending `n` KiB, one every `gapMs`, then printing the answer's body. */
function client(port: number, path: string, n: number, gapMs: number): Deno.ChildProcess {
  const src = `
const c = await Deno.connect({ hostname: "127.0.0.1", port: ${port} });
await c.write(new TextEncoder().encode("POST /${path} HTTP/1.1\\r\\nhost: x\\r\\n" +
  "content-length: ${n * 1024}\\r\\nconnection: close\\r\\n\\r\\n"));
for (let i = 0; i < ${n}; i++) {
  await c.write(new Uint8Array(1024));
  await new Promise((r) => setTimeout(r, ${gapMs}));
}
const b = new Uint8Array(4096);
let s = "";
for (;;) { const k = await c.read(b); if (k === null) break; s += new TextDecoder().decode(b.subarray(0, k)); }
console.log(s.split("\\r\\n\\r\\n")[1]);`;
  return new Deno.Command(Deno.execPath(), { args: ["eval", src], stdout: "piped" }).spawn();
}

function busy(ms: number): void {
  const t = performance.now();
  while (performance.now() - t < ms) { /* a synchronous step holding the thread */ }
}

Deno.test("body timeout: a thread busy past the limit does not time out a body still coming", () =>
  withEnv({ [BODY_TIMEOUT_ENV]: String(LIMIT_MS) }, async () => {
    const ac = new AbortController();
    const srv = Deno.serve(
      { port: 0, hostname: "127.0.0.1", signal: ac.signal, onListen() {} },
      async (req) => {
        const r = new URL(req.url).pathname === "/whole"
          ? await wholeBody(req)
          : await streamBody(req.body!, Number(req.headers.get("content-length")), 1 << 30);
        return new Response(`${r.end} ${r.bytes.byteLength}`);
      },
    );
    try {
      // Streamed: 80 KiB over 4 s (gaps of 50 ms); the thread held 2.5 s from 1 s in.
      // In one piece: 80 KiB over 0.8 s (deadline 1 s + 1 s per 256 KiB), held 2.5 s likewise.
      for (const [path, gap, want] of [["stream", 50, 81920], ["whole", 10, 81920]] as const) {
        const child = client(srv.addr.port, path, 80, gap);
        await new Promise((r) => setTimeout(r, 300));
        busy(2500);
        const out = new TextDecoder().decode((await child.output()).stdout).trim();
        assert.equal(out, `complete ${want}`, path);
      }
    } finally {
      ac.abort();
      await srv.finished;
    }
  }));

Deno.test("body timeout: the timer waits once more only when it fired late", async () => {
  const t0 = performance.now();
  await patientTimeout(50).done;
  const onTime = performance.now() - t0;
  assert.ok(onTime >= 45 && onTime < 150, `on time: ${onTime} ms`);
  const t1 = performance.now();
  const late = patientTimeout(50);
  busy(300); // the timer is due at 50 ms and runs ~250 ms late: it waits 50 ms more
  await late.done;
  const total = performance.now() - t1;
  assert.ok(total >= 340, `late: resolved after ${total} ms, not waiting again`);
  let fired = false;
  const cancelled = patientTimeout(20);
  void cancelled.done.then(() => fired = true);
  cancelled.cancel();
  await new Promise((r) => setTimeout(r, 60));
  assert.equal(fired, false, "cancel clears the timer");
});
