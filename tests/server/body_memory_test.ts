/**
 * A declared length does not reserve memory: safetensors bodies were read in one piece by
 * Deno's `req.bytes()`, which allocates its buffer from the Content-Length (up to 16 MiB) before
 * a byte arrives, so each connection declaring 64 MiB and sending 1 KiB held 16.5 MiB of the
 * server (measured: 30 such, 0.5 GB). Now bodies over 1 MiB are read in one piece only 4 at a
 * time (server/body_read.ts `wholeBodyIfCheap`), the rest stream. Real server processes, by
 * their resident memory (`ps`), with and without HTTP workers (each worker its own 4).
 */
import assert from "node:assert/strict";
import { rawRequest } from "./raw_http.ts";
import { spawnServer } from "./process.ts";
import { MAX_BIG_WHOLE_READS } from "../../server/body_read.ts";

const CONNS = 40;

/** `ps` to read a process's memory with (procps); without it these tests skip, saying so. */
const HAS_PS = (() => {
  try {
    return new Deno.Command("ps", { args: ["-o", "rss=", "-p", "1"] }).outputSync().success;
  } catch {
    return false;
  }
})();
if (!HAS_PS) console.log("body memory tests skipped: no `ps` on this machine");

/** The process's resident memory in MiB (`ps`: Deno asks for --allow-all to read /proc). */
async function rssMiB(pid: number): Promise<number> {
  const out = await new Deno.Command("ps", { args: ["-o", "rss=", "-p", String(pid)] }).output();
  const kib = Number(new TextDecoder().decode(out.stdout).trim());
  assert.ok(out.success && kib > 0, `ps -o rss= -p ${pid}`);
  return kib / 1024;
}

async function stalledBodies(workers: number): Promise<void> {
  const mode = workers > 0 ? ["--http-workers", String(workers)] : [];
  const srv = await spawnServer(["--no-gpu", ...mode]);
  const conns: Deno.TcpConn[] = [];
  try {
    // Warm the path once, so what it allocates for good is not counted below.
    await fetch(`${srv.url}/healthz`).then((r) => r.body?.cancel());
    const before = await rssMiB(srv.child.pid);
    const head = rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/octet-stream",
      "content-length": String(64 << 20),
    });
    for (let i = 0; i < CONNS; i++) {
      const c = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
      conns.push(c);
      await c.write(head);
      await c.write(new Uint8Array(1024).fill(7));
    }
    await new Promise((r) => setTimeout(r, 800));
    const grew = (await rssMiB(srv.child.pid)) - before;
    // Before: 16.5 MiB a connection (~400 MiB here); now at most 4 one-piece reads of 16.5 MiB
    // an isolate reading bodies (the kernel spreads connections over the workers), plus the
    // bytes received and buffers.
    const readers = Math.max(1, workers);
    const bound = readers * MAX_BIG_WHOLE_READS * 16.5 + 2 * CONNS;
    assert.ok(grew < bound, `${CONNS} stalled 64 MiB bodies grew the server ${grew} MiB`);
  } finally {
    for (const c of conns) c.close();
    srv.kill("SIGKILL");
    await srv.exited;
  }
}

Deno.test({
  name: "body memory: declared lengths reserve at most 4 one-piece reads, one thread",
  ignore: Deno.build.os !== "linux" || !HAS_PS,
  fn: () => stalledBodies(0),
});

Deno.test({
  name: "body memory: declared lengths reserve at most 4 one-piece reads, HTTP workers",
  ignore: Deno.build.os !== "linux" || !HAS_PS,
  fn: () => stalledBodies(2),
});
