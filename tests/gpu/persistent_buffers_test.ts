/**
 * gpu/persistent_buffers.ts: one buffer per device and name, kept while it is large enough,
 * replaced by a larger one (never shrunk, never past one storage binding); other names and
 * devices get their own.
 */
import assert from "node:assert/strict";
import { persistentBuffer } from "../../gpu/persistent_buffers.ts";
import { GPU, NO_GPU } from "./helpers.ts";

Deno.test("persistent buffers: kept, grown, separate per name", { ignore: NO_GPU }, () => {
  const name = `test_${crypto.randomUUID()}`;
  const a = persistentBuffer(GPU!, name, 1000);
  assert.ok(a.size >= 1000 && a.size % 256 === 0, `${a.size}`);
  assert.ok(a.usage & GPUBufferUsage.STORAGE);
  assert.equal(persistentBuffer(GPU!, name, 10), a, "large enough: the same buffer");
  const b = persistentBuffer(GPU!, name, a.size + 1);
  assert.notEqual(b, a, "a larger one");
  assert.ok(b.size >= 2 * a.size, "grown geometrically");
  assert.equal(persistentBuffer(GPU!, name, a.size), b, "never shrunk");
  assert.notEqual(persistentBuffer(GPU!, `${name}_other`, 16), b, "another name");
  const limit = Math.min(
    GPU!.limits.maxStorageBufferBindingSize ?? 2 ** 27,
    GPU!.limits.maxBufferSize ?? 2 ** 28,
  );
  assert.ok(b.size <= limit);
});
