/**
 * The end of a drain (server/shutdown.ts): the port closes only once requests have stopped
 * coming. Clients that honour `Retry-After` keep connecting through a SIGTERM; each request gets
 * a 200 or a 503 `shutting_down`, then their connects are refused; none is reset or closed
 * unanswered (a client cannot tell whether such a call ran). Before the quiet window the port
 * closed as soon as the calls in flight were done, resetting the connections the kernel had
 * accepted and the server had not read. Each HTTP engine, on a real port.
 */
import assert from "node:assert/strict";
import { spawnServer } from "./process.ts";
import { rawExchange, rawRequest } from "./raw_http.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * One `GET /healthz` on a new connection: its status, "refused" when the connect was, or
 * "reset or unanswered" when the connection closed without a whole answer.
 */
async function healthOnce(port: number): Promise<{ status: string; retryAfterS: number }> {
  let r: Awaited<ReturnType<typeof rawExchange>>;
  try {
    r = await rawExchange(port, rawRequest("GET", "/healthz", {}));
  } catch (e) {
    return { status: `connect ${(e as Error).name}`, retryAfterS: 0 };
  }
  if (r === null) return { status: "reset or unanswered", retryAfterS: 0 };
  return { status: String(r.status), retryAfterS: Number(r.headers.get("retry-after") ?? 0) };
}

/** `n` clients connecting without pause until refused; a 503 waits its Retry-After first. */
async function politeClients(port: number, n: number, seen: Map<string, number>) {
  await Promise.all(Array.from({ length: n }, async () => {
    for (;;) {
      const r = await healthOnce(port);
      seen.set(r.status, (seen.get(r.status) ?? 0) + 1);
      if (r.status.startsWith("connect")) return;
      if (r.status === "503") await sleep(Math.min(r.retryAfterS, 3) * 1000);
    }
  }));
}

/** The serving modes: each HTTP engine on one thread, and the device threads serving the port. */
const MODES: [string, string[]][] = [
  ["deno", ["--http-engine", "deno"]],
  ["http1", ["--http-engine", "http1"]],
  ["device threads serving the port", ["--device-threads", "2", "--device-threads-http"]],
];

for (const [mode, args] of MODES) {
  Deno.test(`shutdown (${mode}): clients that honour Retry-After are never reset`, async () => {
    const srv = await spawnServer(["--no-gpu", ...args]);
    try {
      const seen = new Map<string, number>();
      const clients = politeClients(srv.port, 8, seen);
      await sleep(400);
      srv.kill("SIGTERM");
      const late = setTimeout(() => srv.kill("SIGKILL"), 20_000);
      const e = await srv.exited;
      clearTimeout(late);
      await clients;
      const counts = JSON.stringify(Object.fromEntries(seen));
      assert.equal(e.code, 0, e.stderr);
      assert.ok((seen.get("200") ?? 0) > 0, counts);
      const lost = [...seen.keys()].filter((s) =>
        s !== "200" && s !== "503" && s !== "connect ConnectionRefused"
      );
      assert.deepEqual(lost, [], `answers: ${counts}; stderr:\n${e.stderr}`);
      // The stop line counts the refusals, wherever they were made (the device threads' own).
      const refused = seen.get("503") ?? 0;
      const tail = refused ? `; ${refused} requests refused while stopping` : "";
      assert.match(e.stderr, new RegExp(`stopped: every call finished \\(\\d+ ms${tail}\\)`));
    } finally {
      srv.kill("SIGKILL");
      await srv.exited;
    }
  });
}
