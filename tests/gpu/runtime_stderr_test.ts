/**
 * gpu/runtime_stderr.ts across threads: while one thread captures fd 2 (Dawn's adapter
 * request), a line another thread of the process logs waits for the capture to end and goes to
 * the real stderr, instead of into the capture (with `--device-threads 2` on Dawn a thread's
 * device line went missing that way). Run in a child process, whose stderr the test reads.
 * @module
 */
import assert from "node:assert/strict";

const MODULE = JSON.stringify(import.meta.resolve("../../gpu/runtime_stderr.ts"));

const WORKER = `
import { captureStderr, useStderrLock } from ${MODULE};
self.onmessage = (e) => {
  useStderrLock(e.data);
  const r = captureStderr(() => {
    self.postMessage({ kind: "capturing" });
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 400);
    return 1;
  });
  self.postMessage({ kind: "done", text: r.text, captured: r.captured });
};`;

const MAIN = `
import { stderrLock, useStderrLock } from ${MODULE};
const sab = stderrLock();
useStderrLock(sab);
const url = URL.createObjectURL(new Blob([${JSON.stringify(WORKER)}], { type: "text/javascript" }));
const w = new Worker(url, { type: "module" });
w.onmessage = (e) => {
  if (e.data.kind === "capturing") console.error("a line of the main thread");
  else {
    console.log(JSON.stringify(e.data));
    w.terminate();
  }
};
w.postMessage(sab);`;

Deno.test("stderr capture: another thread's line during a capture reaches the real stderr", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--ext=js", MAIN],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, stderr);
  const r = JSON.parse(new TextDecoder().decode(out.stdout).trim());
  if (!r.captured) return; // no libc here: nothing was redirected
  assert.doesNotMatch(r.text, /a line of the main thread/);
  assert.match(stderr, /a line of the main thread/);
});
