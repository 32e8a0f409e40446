/**
 * A server out of file descriptors keeps running: idle connections up to the process's fd
 * limit made Deno.serve's accept fail, which rejected `finished` and ended the process (an
 * audit took a default server down with 20,000 idle connections). Now the port is served again
 * once connections close (server/serve_resilient.ts), by the HTTP workers too (each crashed and
 * was started again, dropping every connection it held), and by `--http-engine http1` (whose
 * accept loop retries). Run under `ulimit -n 256` to get there fast.
 */
import assert from "node:assert/strict";

const MAIN = new URL("../../server/main.ts", import.meta.url).pathname;
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `said`: what the server's log says of the refused accepts (Deno.serve's or http1's words). */
async function exhaust(mode: string[], said: RegExp): Promise<void> {
  const child = new Deno.Command("bash", {
    args: [
      "-c",
      `ulimit -n 256 && exec "${Deno.execPath()}" run --config "${CONFIG}" --allow-net ` +
      `--allow-read --allow-env "${MAIN}" --no-gpu --port 0 ${mode.join(" ")}`,
    ],
    stdout: "piped",
    stderr: "piped",
    env: { XDG_RUNTIME_DIR: "/tmp" },
  }).spawn();
  let err = "";
  const errDone = (async () => {
    for await (const c of child.stderr.pipeThrough(new TextDecoderStream())) err += c;
  })();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  let m: RegExpMatchArray | null = null;
  while (!(m = out.match(/listening on http:\/\/\S+:(\d+)/))) {
    const r = await reader.read();
    assert.ok(!r.done, `the server exited before listening: ${err}`);
    out += r.value;
  }
  const port = Number(m[1]);
  const conns: Deno.Conn[] = [];
  let exited: number | null = null;
  child.status.then((s) => exited = s.code);
  try {
    for (let i = 0; i < 400; i++) {
      try {
        conns.push(await Deno.connect({ hostname: "127.0.0.1", port }));
      } catch {
        break; // refused: the server is out of descriptors
      }
    }
    await sleep(500);
    assert.equal(exited, null, `the server exited with ${conns.length} idle connections: ${err}`);
    for (const c of conns) c.close();
    conns.length = 0;
    let ok = false;
    for (let t = 0; t < 40 && !ok; t++) {
      await sleep(100);
      ok = await fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.ok, () => false);
    }
    assert.ok(ok, `no answer after the connections closed: ${err}`);
    assert.match(err, said);
    assert.doesNotMatch(err, /crashed/);
  } finally {
    for (const c of conns) c.close();
    if (exited === null) child.kill("SIGTERM");
    await child.status;
    await reader.cancel().catch(() => {});
    await errDone;
  }
}

const DENO_SERVE_STOPPED = /http: the server stopped accepting/;

Deno.test("server: out of file descriptors, it serves again once connections close", () =>
  exhaust([], DENO_SERVE_STOPPED));

Deno.test("server: out of file descriptors, the service's own HTTP/1.1 server serves again too", () =>
  exhaust(
    ["--http-engine", "http1"],
    /http: accept failed; retrying in \d+ ms: Error: Too many open files/,
  ));

Deno.test("server: out of file descriptors, the HTTP workers serve again too", () =>
  exhaust(["--http-workers", "2"], DENO_SERVE_STOPPED));
