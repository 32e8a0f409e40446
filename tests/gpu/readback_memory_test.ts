/**
 * gpu/readback_memory.ts without a GPU (fake buffers and pool): a lent read-back is the mapped
 * range itself, unmapped and pooled exactly once at release; one not asked to be lent is a copy
 * and leaves the buffer to the launch; a lent one whose result is dropped unreleased is given
 * back once the collector takes its release function (in a child process run with
 * `--expose-gc`).
 * @module
 */
import assert from "node:assert/strict";
import { lentReadbackStats, readbackMemory } from "../../gpu/readback_memory.ts";
import { lentReturned } from "../../gpu/lent_count.ts";

/** A stand-in device (no runtime's: its mapped ranges are the mapping) and a buffer. */
const device = {} as GPUDevice;
function fakes() {
  const log: string[] = [];
  const buffer = { unmap: () => log.push("unmap") } as unknown as GPUBuffer;
  const pool = { release: (b: GPUBuffer) => log.push(b === buffer ? "pooled" : "other") };
  return { log, buffer, pool };
}

Deno.test("readback memory: lent, the mapped range itself, given back once at release", () => {
  const { log, buffer, pool } = fakes();
  const range = new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8]).buffer;
  const before = lentReadbackStats();
  const m = readbackMemory(device, pool, buffer, range, 8, true);
  assert.equal(m.mem, range);
  assert.equal(m.lent, true);
  assert.deepEqual(log, [], "still mapped while the result holds it");
  assert.equal(lentReadbackStats().out, before.out + 1);
  m.release();
  m.release();
  assert.deepEqual(log, ["unmap", "pooled"]);
  assert.equal(lentReadbackStats().out, before.out);
  assert.equal(lentReadbackStats().lent, before.lent + 1);
});

Deno.test("readback memory: not lent, a copy; the buffer stays the launch's", () => {
  const { log, buffer, pool } = fakes();
  const bytes = new Uint8Array([9, 8, 7, 6, 5, 4, 3, 2]);
  const m = readbackMemory(device, pool, buffer, bytes.buffer, 6, false);
  assert.equal(m.lent, false);
  assert.notEqual(m.mem, bytes.buffer);
  assert.deepEqual([...new Uint8Array(m.mem, 0, 6)], [9, 8, 7, 6, 5, 4]);
  bytes.fill(0); // the launch unmaps: the copy keeps its bytes
  assert.deepEqual([...new Uint8Array(m.mem, 0, 6)], [9, 8, 7, 6, 5, 4]);
  m.release();
  assert.deepEqual(log, [], "the launch unmaps and pools an unlent buffer itself");
});

Deno.test("readback memory: a lent result dropped unreleased is given back by the collector", async () => {
  const script = `
import { lentReadbackStats, readbackMemory } from ${
    JSON.stringify(import.meta.resolve("../../gpu/readback_memory.ts"))
  };
const log = [];
const buffer = { unmap: () => log.push("unmap") };
const pool = { release: () => log.push("pooled") };
(() => { readbackMemory({}, pool, buffer, new ArrayBuffer(16), 16, true); })();
for (let i = 0; i < 50 && lentReadbackStats().collected === 0; i++) {
  globalThis.gc();
  await new Promise((r) => setTimeout(r, 10));
}
console.log(JSON.stringify({ log, ...lentReadbackStats() }));
`;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--v8-flags=--expose-gc", "--ext=ts", script],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  assert.deepEqual(JSON.parse(text), { log: ["unmap", "pooled"], out: 0, lent: 1, collected: 1 });
});

Deno.test("readback memory: lentReturned waits for the last lent read-back (a closing device does)", async () => {
  const { buffer, pool } = fakes();
  const base = lentReadbackStats().out;
  assert.equal(base, 0, "nothing lent before");
  const m = readbackMemory(device, pool, buffer, new ArrayBuffer(16), 16, true);
  let done = false;
  const waited = lentReturned().then(() => done = true);
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(done, false, "resolved while a read-back was out");
  m.release();
  await waited;
  assert.equal(done, true);
  assert.equal(lentReadbackStats().out, 0);
});
