/**
 * gpu/runtime_stderr.ts across threads: while one thread captures fd 2 (Dawn's adapter
 * request), a line another thread of the process logs waits for the capture to end and goes to
 * the real stderr, instead of into the capture (with `--device-threads 2` on Dawn a thread's
 * device line went missing that way). Run in a child process, whose stderr the test reads.
 * @module
 */
import assert from "node:assert/strict";
import { PRINT_WAIT_MS } from "../../gpu/runtime_stderr.ts";

const MODULE = JSON.stringify(import.meta.resolve("../../gpu/runtime_stderr.ts"));

const worker = (holdMs: number) => `
import { captureStderr, useStderrLock } from ${MODULE};
self.onmessage = (e) => {
  useStderrLock(e.data);
  const r = captureStderr(() => {
    self.postMessage({ kind: "capturing" });
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ${holdMs});
    return 1;
  });
  self.postMessage({ kind: "done", text: r.text, captured: r.captured });
};`;

const main = (holdMs: number) => `
import { stderrLock, useStderrLock } from ${MODULE};
const sab = stderrLock();
useStderrLock(sab);
const url = URL.createObjectURL(new Blob([${
  JSON.stringify(worker(holdMs))
}], { type: "text/javascript" }));
const w = new Worker(url, { type: "module" });
w.onmessage = (e) => {
  if (e.data.kind === "capturing") {
    const t = performance.now();
    console.error("a line of the main thread");
    globalThis.waited = performance.now() - t;
  } else {
    console.log(JSON.stringify({ ...e.data, waited: globalThis.waited }));
    w.terminate();
  }
};
w.postMessage(sab);`;

async function run(holdMs: number) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--ext=js", main(holdMs)],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, stderr);
  return { stderr, r: JSON.parse(new TextDecoder().decode(out.stdout).trim()) };
}

Deno.test("stderr capture: another thread's line during a capture reaches the real stderr", async () => {
  const { stderr, r } = await run(400);
  if (!r.captured) return; // no libc here: nothing was redirected
  assert.doesNotMatch(r.text, /a line of the main thread/);
  assert.match(stderr, /a line of the main thread/);
});

Deno.test("stderr capture: a capture that does not end delays another thread's line, no more", async () => {
  const { r } = await run(PRINT_WAIT_MS + 1500);
  if (!r.captured) return;
  assert.ok(r.waited >= PRINT_WAIT_MS - 50, `the line waited ${r.waited} ms`);
  assert.ok(
    r.waited < PRINT_WAIT_MS + 1000,
    `the line waited ${r.waited} ms: it waited the capture out`,
  );
});
