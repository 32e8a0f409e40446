/**
 * A declared length reserves a bounded amount of memory: safetensors bodies read in one piece by
 * Deno's `req.bytes()` get a buffer sized by their Content-Length (up to 16 MiB) before a byte
 * arrives, held until the read ends (for a stalled body: when its client closes, a 408 does not
 * close the socket). Each connection declaring 64 MiB and sending 1 KiB held 16.5 MiB (30 such:
 * 0.5 GB); 300 declaring 1 MiB held 315 MiB; and reads that timed out gave their place to new
 * ones while their buffers stayed. Now the one-piece reads in flight share a budget of 64 MiB per
 * thread that reads bodies (server/body_read.ts `wholeBodyIfCheap`), the rest stream. Real server
 * processes, by their resident memory (`ps`), with and without HTTP workers.
 */
import assert from "node:assert/strict";
import { rawRequest } from "./raw_http.ts";
import { spawnServer } from "./process.ts";
import { WHOLE_READ_BUDGET_BYTES } from "../../server/body_read.ts";

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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Stall {
  workers: number;
  /** Declared bytes of each body (1 KiB of it sent). */
  declared: number;
  /** Connections a wave, and waves (each after the last one's 408s, when `timeoutMs` is set). */
  conns: number;
  waves: number;
  timeoutMs?: number;
}

async function stalledBodies(s: Stall): Promise<void> {
  const mode = s.workers > 0 ? ["--http-workers", String(s.workers)] : [];
  const timeout = s.timeoutMs ? ["--body-timeout-ms", String(s.timeoutMs)] : [];
  const srv = await spawnServer(["--no-gpu", ...mode, ...timeout]);
  const conns: Deno.TcpConn[] = [];
  try {
    await fetch(`${srv.url}/healthz`).then((r) => r.body?.cancel());
    const before = await rssMiB(srv.child.pid);
    const head = rawRequest("POST", "/v1/attention/forward", {
      "content-type": "application/octet-stream",
      "content-length": String(s.declared),
    });
    for (let w = 0; w < s.waves; w++) {
      for (let i = 0; i < s.conns; i++) {
        const c = await Deno.connect({ hostname: "127.0.0.1", port: srv.port });
        conns.push(c);
        await c.write(head);
        await c.write(new Uint8Array(1024).fill(7));
      }
      // With a timeout, wait past every 408 (the deadline: limit + 1 s per 256 KiB declared).
      await sleep(s.timeoutMs ? s.timeoutMs + 1000 * Math.ceil(s.declared / 262144) + 500 : 800);
    }
    const grew = (await rssMiB(srv.child.pid)) - before;
    // At most the budget a reading thread (the kernel spreads connections over the workers),
    // plus what came and each connection's own buffers.
    const budget = Math.max(1, s.workers) * WHOLE_READ_BUDGET_BYTES / 2 ** 20;
    const bound = 1.1 * budget + 0.25 * conns.length + 24;
    assert.ok(
      grew < bound,
      `${conns.length} stalled bodies grew the server ${grew} MiB (< ${bound})`,
    );
  } finally {
    for (const c of conns) c.close();
    srv.kill("SIGKILL");
    await srv.exited;
  }
}

const cases: [string, Stall][] = [
  ["64 MiB declared, one thread", { workers: 0, declared: 64 << 20, conns: 40, waves: 1 }],
  ["64 MiB declared, HTTP workers", { workers: 2, declared: 64 << 20, conns: 40, waves: 1 }],
  ["1 MiB declared, one thread", { workers: 0, declared: 1 << 20, conns: 200, waves: 1 }],
  [
    "reads timed out while their clients stay",
    { workers: 0, declared: 1 << 20, conns: 64, waves: 3, timeoutMs: 300 },
  ],
];
for (const [name, s] of cases) {
  Deno.test({
    name: `body memory: declared lengths reserve a bounded amount, ${name}`,
    ignore: Deno.build.os !== "linux" || !HAS_PS,
    fn: () => stalledBodies(s),
  });
}
