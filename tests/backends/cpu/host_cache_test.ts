/**
 * backends/cpu/host_cache.ts: sizes per storage dtype, zero fill, copying imports with length
 * checks, row offsets for both layouts (a bijection onto the buffer), row round trips that
 * store exactly what core/dtype.ts would encode, read() copies, destroy; shared memory:
 * handle/attach views of one memory (also across a real worker), rowBytes views.
 */
import assert from "node:assert/strict";
import { bytesPerElement, encode, roundTo } from "../../../core/dtype.ts";
import { ServiceError } from "../../../core/errors.ts";
import { HostKvCache } from "../../../backends/cpu/host_cache.ts";
import type { KvCacheDType, KvCacheSpec, KvLayout } from "../../../core/types.ts";

function spec(kv: KvCacheDType, layout: KvLayout, o: Partial<KvCacheSpec> = {}): KvCacheSpec {
  return {
    num_blocks: 3,
    block_size: 4,
    num_kv_heads: 2,
    head_size: 5,
    dtype: "float16",
    kv_cache_dtype: kv,
    layout,
    ...o,
  };
}
const KV: KvCacheDType[] = ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"];

Deno.test("create: zeroed, sized by the storage dtype", () => {
  for (const kv of KV) {
    for (const dtype of ["float32", "float16"] as const) {
      const c = HostKvCache.create(spec(kv, "NHD", { dtype }));
      const elems = 3 * 4 * 2 * 5;
      const want = kv === "auto" ? dtype : kv === "fp8" ? "fp8_e4m3" : kv;
      assert.equal(c.storage_dtype, want);
      assert.equal(c.storage, "host");
      assert.equal(c.key.byteLength, elems * bytesPerElement(want));
      assert.equal(c.bytes, 2 * elems * bytesPerElement(want));
      assert.ok(c.key.every((b) => b === 0) && c.value.every((b) => b === 0));
    }
  }
});

Deno.test("create/fromBytes: bad specs and lengths are 422 naming the field", () => {
  const bad = (f: () => unknown, code: string, path: string) =>
    assert.throws(f, (e) => {
      assert.ok(e instanceof ServiceError);
      assert.equal(e.status, 422);
      assert.equal(e.code, code);
      assert.equal(e.issues?.[0].path[0], path);
      return true;
    });
  bad(
    () => HostKvCache.create(spec("auto", "NHD", { block_size: 0 })),
    "invalid_cache_spec",
    "block_size",
  );
  bad(
    () => HostKvCache.create(spec("auto", "NHD", { head_size: 2.5 })),
    "invalid_cache_spec",
    "head_size",
  );
  const s = spec("fp8_e4m3", "HND");
  const n = 3 * 4 * 2 * 5;
  bad(
    () => HostKvCache.fromBytes(s, new Uint8Array(n - 1), new Uint8Array(n)),
    "invalid_batch",
    "key_cache",
  );
  bad(
    () => HostKvCache.fromBytes(s, new Uint8Array(n), new Uint8Array(n * 2)),
    "invalid_batch",
    "value_cache",
  );
});

Deno.test("fromBytes copies; read() returns copies", async () => {
  const s = spec("float16", "NHD");
  const n = 3 * 4 * 2 * 5 * 2;
  const k = crypto.getRandomValues(new Uint8Array(n)),
    v = crypto.getRandomValues(new Uint8Array(n));
  const k0 = k.slice();
  const c = HostKvCache.fromBytes(s, k, v);
  k.fill(7);
  assert.deepEqual(c.key, k0, "cache kept its own copy");
  const r = await c.read();
  assert.deepEqual(r.key, k0);
  assert.deepEqual(r.value, v);
  r.key.fill(9);
  assert.deepEqual(c.key, k0, "mutating read() output does not touch the cache");
});

Deno.test("offset: NHD and HND formulas, rows tile the buffer exactly once", () => {
  const nhd = HostKvCache.create(spec("auto", "NHD"));
  const hnd = HostKvCache.create(spec("auto", "HND"));
  // block 2, slot 3, head 1: NHD ((2*4+3)*2+1)*5 = 115; HND ((2*2+1)*4+3)*5 = 115 too, so
  // check a point where they differ as well.
  assert.equal(nhd.offset(2, 3, 1), 115);
  assert.equal(hnd.offset(2, 3, 1), 115);
  assert.equal(nhd.offset(1, 2, 0), ((1 * 4 + 2) * 2 + 0) * 5);
  assert.equal(hnd.offset(1, 2, 0), ((1 * 2 + 0) * 4 + 2) * 5);
  assert.notEqual(nhd.offset(1, 2, 0), hnd.offset(1, 2, 0));
  for (const c of [nhd, hnd]) {
    const seen = new Set<number>();
    for (let b = 0; b < 3; b++) {
      for (let s = 0; s < 4; s++) {
        for (let h = 0; h < 2; h++) {
          const o = c.offset(b, s, h);
          assert.equal(o % 5, 0);
          seen.add(o);
        }
      }
    }
    assert.equal(seen.size, 24, `${c.spec.layout} rows are distinct`);
    assert.equal(Math.max(...seen), 23 * 5, `${c.spec.layout} rows cover the buffer`);
  }
});

Deno.test("writeRow/readRow: stored bytes are the dtype's rounding, only that row changes", () => {
  for (const kv of KV) {
    for (const layout of ["NHD", "HND"] as const) {
      const c = HostKvCache.create(spec(kv, layout, { dtype: "bfloat16" }));
      const d = c.storage_dtype, bpe = bytesPerElement(d);
      const src = Array.from({ length: 12 }, () => (Math.random() - 0.5) * 8);
      const before = c.value.slice();
      c.writeRow("value", 2, 1, 1, src, 3); // elements 3..7
      const row = c.readRow("value", 2, 1, 1);
      const o = c.offset(2, 1, 1);
      for (let i = 0; i < 5; i++) {
        assert.equal(row[i], roundTo(d, src[3 + i]), `${kv} ${layout} [${i}]`);
      }
      const want = encode(d, src.slice(3, 8));
      assert.deepEqual(c.value.subarray(o * bpe, (o + 5) * bpe), want, `${kv} ${layout} bytes`);
      for (let i = 0; i < c.value.byteLength; i++) {
        if (i < o * bpe || i >= (o + 5) * bpe) assert.equal(c.value[i], before[i], `byte ${i}`);
      }
      assert.ok(c.key.every((b) => b === 0), "key untouched by a value write");
    }
  }
});

Deno.test("destroy: the cache is unusable afterwards", async () => {
  const c = HostKvCache.create(spec("auto", "NHD"));
  assert.equal(c.destroyed, false);
  c.destroy();
  assert.equal(c.destroyed, true);
  await assert.rejects(
    async () => await c.read(),
    (e) => e instanceof ServiceError && e.code === "cache_destroyed",
  );
  assert.throws(() => c.readRow("key", 0, 0, 0), ServiceError);
});

Deno.test("shared memory: K/V live in SharedArrayBuffers; read() copies into plain buffers", async () => {
  const k = crypto.getRandomValues(new Uint8Array(3 * 4 * 2 * 5 * 2));
  const c = HostKvCache.fromBytes(spec("auto", "HND"), k, k);
  for (const half of [c.key, c.value]) assert.ok(half.buffer instanceof SharedArrayBuffer);
  const r = await c.read();
  for (const half of [r.key, r.value]) {
    assert.ok(half.buffer instanceof ArrayBuffer && !(half.buffer instanceof SharedArrayBuffer));
    assert.deepEqual(half, k);
  }
  // Plain copies are what Response and WebCrypto accept (a shared view is refused there).
  assert.equal((await new Response(r.key as Uint8Array<ArrayBuffer>).bytes()).byteLength, k.length);
});

Deno.test("handle/attach: a second view of the same memory, no copy", () => {
  const a = HostKvCache.create(spec("bfloat16", "NHD", { dtype: "float32" }));
  const h = a.handle();
  assert.equal(h.key, a.key.buffer);
  assert.equal(h.value, a.value.buffer);
  const b = HostKvCache.attach(h);
  assert.deepEqual(b.spec, a.spec);
  assert.equal(b.storage_dtype, "bfloat16");
  const row = [1.5, -2, 0.25, 3, -0.125];
  b.writeRow("value", 2, 3, 1, row);
  assert.deepEqual(Array.from(a.readRow("value", 2, 3, 1)), row, "a sees b's write");
  a.writeRow("key", 0, 1, 0, row);
  assert.deepEqual(Array.from(b.readRow("key", 0, 1, 0)), row, "b sees a's write");
  // rowBytes is a view of exactly that row.
  const bytes = a.rowBytes("value", 2, 3, 1);
  assert.equal(bytes.byteLength, 5 * 2);
  assert.equal(bytes.byteOffset, a.offset(2, 3, 1) * 2);
  bytes.fill(0);
  assert.deepEqual(Array.from(b.readRow("value", 2, 3, 1)), [0, 0, 0, 0, 0]);
});

Deno.test("handle/attach: refused on a destroyed cache (409) and on ill-sized buffers (422)", () => {
  const c = HostKvCache.create(spec("auto", "NHD"));
  const h = c.handle();
  c.destroy();
  assert.throws(
    () => c.handle(),
    (e) => e instanceof ServiceError && e.status === 409 && e.code === "cache_destroyed",
  );
  assert.throws(
    () => HostKvCache.attach({ ...h, value: new SharedArrayBuffer(7) }),
    (e) => e instanceof ServiceError && e.status === 422 && /7 bytes, expected 240/.test(e.message),
  );
  assert.throws(
    () => HostKvCache.attach({ ...h, spec: { ...h.spec, head_size: 0 } }),
    (e) => e instanceof ServiceError && e.code === "invalid_cache_spec",
  );
});

Deno.test("shared memory: a worker writes the cache in place, the owner sees it", async () => {
  const c = HostKvCache.create(spec("fp8_e4m3", "NHD"));
  const src = `import { HostKvCache } from ${
    JSON.stringify(import.meta.resolve("../../../backends/cpu/host_cache.ts"))
  };
self.onmessage = (e) => {
  HostKvCache.attach(e.data).writeRow("key", 1, 2, 1, [1, 2, 3, 4, 448]);
  self.postMessage("done");
};`;
  const url = URL.createObjectURL(new Blob([src], { type: "application/javascript" }));
  const w = new Worker(url, { type: "module" });
  try {
    const done = new Promise((res, rej) => {
      w.onmessage = (e) => res(e.data);
      w.onerror = (e) => {
        e.preventDefault();
        rej(new Error(e.message));
      };
    });
    w.postMessage(c.handle());
    assert.equal(await done, "done");
    assert.deepEqual(Array.from(c.readRow("key", 1, 2, 1)), [1, 2, 3, 4, 448]);
  } finally {
    w.terminate();
    URL.revokeObjectURL(url);
  }
});

Deno.test("create/fromBytes/attach: an unknown dtype or kv_cache_dtype is 422 invalid_cache_spec naming it", () => {
  const cases: [Partial<KvCacheSpec>, string, string][] = [
    [{ dtype: "float64" as KvCacheSpec["dtype"] }, "dtype", "float64"],
    [{ kv_cache_dtype: "int4" as KvCacheDType }, "kv_cache_dtype", "int4"],
    [{ kv_cache_dtype: "float32" as KvCacheDType }, "kv_cache_dtype", "float32"],
  ];
  for (const [o, field, value] of cases) {
    const s = spec("auto", "NHD", o);
    const n = 3 * 4 * 2 * 5 * 2;
    for (
      const f of [
        () => HostKvCache.create(s),
        () => HostKvCache.fromBytes(s, new Uint8Array(n), new Uint8Array(n)),
        () =>
          HostKvCache.attach({
            spec: s,
            key: new SharedArrayBuffer(n),
            value: new SharedArrayBuffer(n),
          }),
      ]
    ) {
      assert.throws(f, (e) => {
        assert.ok(e instanceof ServiceError, `${field} ${value}: ${e}`);
        assert.equal(e.status, 422);
        assert.equal(e.code, "invalid_cache_spec");
        assert.deepEqual(e.issues?.[0].path, [field]);
        assert.match(e.message, new RegExp(`^${field} .*got ${value}`));
        return true;
      });
    }
  }
});

Deno.test("readRow/writeRow/rowBytes: a block, slot or kv head outside the cache is a RangeError", () => {
  for (const layout of ["NHD", "HND"] as const) {
    const c = HostKvCache.create(spec("auto", layout)); // 3 blocks of 4 slots, 2 kv heads
    const row = [1, 2, 3, 4, 5];
    const rows: [number, number, number, RegExp][] = [
      [0, 20, 0, /slot 20 .*block_size 4/],
      [0, 4, 0, /slot 4 /],
      [0, -1, 0, /slot -1 /],
      [5, 0, 0, /block 5 .*3 blocks/],
      [3, 0, 0, /block 3 /],
      [-1, 0, 0, /block -1 /],
      [Number.NaN, 0, 0, /block NaN /],
      [0, 1.5, 0, /slot 1\.5 /],
      [0, 0, 2, /kv head 2 .*2 kv heads/],
    ];
    for (const [b, s, h, why] of rows) {
      const before = [c.key.slice(), c.value.slice()];
      assert.throws(() => c.writeRow("key", b, s, h, row), RangeError, `write ${b},${s},${h}`);
      assert.throws(() => c.writeRow("value", b, s, h, row), why, `write ${b},${s},${h}`);
      assert.throws(() => c.readRow("key", b, s, h), why, `read ${b},${s},${h}`);
      assert.throws(() => c.rowBytes("value", b, s, h), why, `rowBytes ${b},${s},${h}`);
      assert.deepEqual([c.key, c.value], before, `${layout} ${b},${s},${h}: nothing written`);
    }
    // The last row is still in range.
    c.writeRow("key", 2, 3, 1, row);
    assert.deepEqual(Array.from(c.readRow("key", 2, 3, 1)), row);
  }
});
