import assert from "node:assert/strict";
import { ServiceError } from "../../core/errors.ts";
import { parseSafetensors, serializeSafetensors } from "../../core/safetensors.ts";
import { handSafetensors } from "../support/hand_safetensors.ts";

function rejects(bytes: Uint8Array, pattern: RegExp): void {
  assert.throws(() => parseSafetensors(bytes), (e: unknown) => {
    assert.ok(e instanceof ServiceError, `not a ServiceError: ${e}`);
    assert.equal(e.status, 400);
    assert.equal(e.code, "bad_safetensors");
    assert.match(e.message, pattern);
    assert.ok(e.issues && e.issues.length > 0, `no issues: ${e.message}`);
    assert.match(e.message, new RegExp(RegExp.escape(e.issues[0].message)));
    return true;
  });
}

Deno.test("safetensors: parses a hand-built file", () => {
  const f32 = new Float32Array([1.5, -2.25, 3]);
  const i64 = new BigInt64Array([7n, -1n]);
  const data = new Uint8Array(12 + 16);
  data.set(new Uint8Array(f32.buffer), 0);
  data.set(new Uint8Array(i64.buffer), 12);
  const file = handSafetensors({
    __metadata__: { request: '{"a":1}' },
    b: { dtype: "I64", shape: [2], data_offsets: [12, 28] },
    a: { dtype: "F32", shape: [3], data_offsets: [0, 12] },
  }, data);
  const parsed = parseSafetensors(file);
  assert.deepEqual(Object.keys(parsed.tensors), ["a", "b"], "ordered by offset");
  assert.deepEqual(parsed.metadata, { request: '{"a":1}' });
  const a = parsed.tensors.a;
  assert.equal(a.dtype, "F32");
  assert.deepEqual(a.shape, [3]);
  assert.deepEqual(Array.from(new Float32Array(a.data.slice().buffer)), [1.5, -2.25, 3]);
  assert.deepEqual(Array.from(new BigInt64Array(parsed.tensors.b.data.slice().buffer)), [7n, -1n]);
});

Deno.test("safetensors: serialize → parse round-trips random tensors, data 8-aligned", () => {
  const q = new Float32Array(2 * 3 * 5).map(() => Math.random() - 0.5);
  const h = new Uint16Array(7).map(() => (Math.random() * 65536) | 0);
  const e = new Uint8Array(3).map(() => (Math.random() * 256) | 0);
  const tensors = {
    query: { dtype: "F32" as const, shape: [2, 3, 5], data: new Uint8Array(q.buffer) },
    half: { dtype: "BF16" as const, shape: [7], data: new Uint8Array(h.buffer) },
    fp8: { dtype: "F8_E4M3" as const, shape: [3, 1], data: e },
    empty: { dtype: "I32" as const, shape: [0, 4], data: new Uint8Array(0) },
    scalar: { dtype: "I32" as const, shape: [], data: new Uint8Array([1, 0, 0, 0]) },
  };
  const bytes = serializeSafetensors(tensors, { backend: "X" });
  const headerLen = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  assert.equal(headerLen % 8, 0);
  const back = parseSafetensors(bytes);
  assert.deepEqual(back.metadata, { backend: "X" });
  for (const [name, t] of Object.entries(tensors)) {
    assert.equal(back.tensors[name].dtype, t.dtype);
    assert.deepEqual(back.tensors[name].shape, t.shape);
    assert.deepEqual(back.tensors[name].data, t.data, name);
  }
  assert.throws(
    () => serializeSafetensors({ x: { dtype: "F32", shape: [2], data: new Uint8Array(4) } }),
    /needs 8/,
  );
});

Deno.test("safetensors: strict validation", async (t) => {
  const ok = { dtype: "F32", shape: [2], data_offsets: [0, 8] };
  await t.step("shorter than 8 bytes", () => rejects(new Uint8Array(5), /shorter than/));
  await t.step("header length beyond body", () => {
    rejects(handSafetensors({ a: ok }, new Uint8Array(8), 1000n), /runs past the end/);
  });
  await t.step("header over 100 MB", () => {
    rejects(handSafetensors({ a: ok }, new Uint8Array(8), 200_000_000n), /exceeds/);
  });
  await t.step(
    "not JSON",
    () => rejects(handSafetensors("{nope", new Uint8Array(0)), /not valid UTF-8 JSON/),
  );
  await t.step(
    "not an object",
    () => rejects(handSafetensors("[1,2]", new Uint8Array(0)), /JSON object/),
  );
  await t.step("unknown dtype, named", () => {
    rejects(
      handSafetensors({ a: { ...ok, dtype: "F64" } }, new Uint8Array(8)),
      /a\.dtype: unsupported dtype "F64"/,
    );
  });
  await t.step("a missing or non-string dtype says so (was: unsupported dtype undefined)", () => {
    const { dtype: _, ...noDtype } = ok;
    const supported = /\(supported: F32, [^)]*\)/.source;
    const rejectsDtype = (dtype: unknown, got: string) => {
      const header = dtype === undefined ? { a: noDtype } : { a: { ...ok, dtype } };
      rejects(
        handSafetensors(header, new Uint8Array(8)),
        new RegExp(`a\\.dtype: dtype must be a string ${supported}, got ${RegExp.escape(got)}$`),
      );
    };
    rejectsDtype(undefined, "undefined (missing)");
    rejectsDtype(16, "16");
    rejectsDtype(null, "null");
    rejectsDtype(["F32"], '["F32"]');
    // The other fields say a missing value the same way.
    const { shape: _s, ...noShape } = ok;
    rejects(handSafetensors({ a: noShape }, new Uint8Array(8)), /got undefined \(missing\)$/);
  });
  await t.step("bad shape", () => {
    rejects(handSafetensors({ a: { ...ok, shape: [-1] } }, new Uint8Array(8)), /shape must be/);
  });
  await t.step("offsets out of range", () => {
    rejects(
      handSafetensors({ a: { ...ok, data_offsets: [0, 16] } }, new Uint8Array(8)),
      /out of range/,
    );
  });
  await t.step("begin after end", () => {
    rejects(
      handSafetensors({ a: { ...ok, data_offsets: [8, 0] } }, new Uint8Array(8)),
      /begin <= end/,
    );
  });
  await t.step("byte size differs from dtype x shape", () => {
    rejects(
      handSafetensors({ a: { ...ok, shape: [3] } }, new Uint8Array(8)),
      /8 bytes but F32 x \[3\] needs 12/,
    );
  });
  await t.step("overlapping tensors", () => {
    rejects(
      handSafetensors(
        { a: ok, b: { dtype: "F32", shape: [2], data_offsets: [4, 12] } },
        new Uint8Array(12),
      ),
      /overlaps/,
    );
  });
  await t.step("hole and trailing bytes", () => {
    rejects(
      handSafetensors({ a: { dtype: "F32", shape: [1], data_offsets: [4, 8] } }, new Uint8Array(8)),
      /\[0, 4\) belong to no tensor/,
    );
    rejects(handSafetensors({ a: ok }, new Uint8Array(12)), /\[8, 12\) belong to no tensor/);
  });
  await t.step("metadata values must be strings", () => {
    rejects(
      handSafetensors({ __metadata__: { a: 1 }, x: ok }, new Uint8Array(8)),
      /__metadata__.a/,
    );
  });
});

Deno.test("safetensors: a header seen before is not parsed again; views and problems are as fresh", () => {
  const header = {
    __metadata__: { k: "v" },
    a: { dtype: "F32", shape: [2], data_offsets: [0, 8] },
  };
  let scans = 0;
  const scanHeader = () => void scans++;
  const one = handSafetensors(header, new Uint8Array(new Float32Array([1, 2]).buffer));
  const two = handSafetensors(header, new Uint8Array(new Float32Array([3, 4]).buffer));
  const f1 = parseSafetensors(one, { scanHeader });
  const f2 = parseSafetensors(two, { scanHeader });
  assert.equal(scans, 1, "the second, same header was not scanned or parsed again");
  // Each call's tensors are views of its own bytes.
  assert.deepEqual(Array.from(new Float32Array(f1.tensors.a.data.slice().buffer)), [1, 2]);
  assert.deepEqual(Array.from(new Float32Array(f2.tensors.a.data.slice().buffer)), [3, 4]);
  assert.equal(f2.tensors.a.data.buffer, two.buffer);
  assert.deepEqual(f2.metadata, { k: "v" });
  // Each call's shapes and metadata are its own (typed mutable, and mutable: a client's
  // `cacheData` shape threw on `push` when they were the memo's frozen arrays): changing them
  // changes no other call's.
  f2.tensors.a.shape.push(3);
  f2.metadata.k = "w";
  const f3 = parseSafetensors(one);
  assert.deepEqual(f3.tensors.a.shape, [2]);
  assert.deepEqual(f3.metadata, { k: "v" });
  assert.deepEqual(f1.tensors.a.shape, [2]);
  // The same header with another data length is checked again, with its own problem.
  rejects(handSafetensors(header, new Uint8Array(12)), /data bytes \[8, 12\) belong to no tensor/);
  rejects(handSafetensors(header, new Uint8Array(4)), /out of range of the 4-byte data section/);
  // A rejected header is never remembered: the same bad header fails again.
  rejects(
    handSafetensors({ a: { dtype: "F64", shape: [1], data_offsets: [0, 8] } }, new Uint8Array(8)),
    /F64/,
  );
  rejects(
    handSafetensors({ a: { dtype: "F64", shape: [1], data_offsets: [0, 8] } }, new Uint8Array(8)),
    /F64/,
  );
});

Deno.test("safetensors: a header with thousands of bad tensors lists 100 issues and counts the rest", () => {
  const header: Record<string, unknown> = {};
  for (let i = 0; i < 5000; i++) {
    header[`t${i}`] = { dtype: "F99", shape: [1], data_offsets: [0, 2] };
  }
  try {
    parseSafetensors(handSafetensors(header, new Uint8Array(2)));
    assert.fail("parsed");
  } catch (e) {
    assert.ok(e instanceof ServiceError, String(e));
    assert.equal(e.code, "bad_safetensors");
    assert.equal(e.issues?.length, 101);
    assert.deepEqual(e.issues?.[100], { path: [], message: "4900 more issues not listed" });
    assert.match(
      e.message,
      /^invalid safetensors: t0\.dtype: unsupported dtype "F99".*\(and 4999 more\)$/,
    );
  }
});

Deno.test("safetensors: a scan that reports repeated names is not followed by a second walk", () => {
  // wire/codec.ts's scan finds the first repeated name in its depth pass; the parser walked the
  // header again for it on every miss of the layout memo.
  const text =
    '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}';
  const file = (t: string) => {
    const h = new TextEncoder().encode(t);
    const out = new Uint8Array(8 + h.length + 8);
    new DataView(out.buffer).setBigUint64(0, BigInt(h.length), true);
    out.set(h, 8);
    return out;
  };
  // What the scan says is what is refused: here a name the header does not repeat.
  const said = { path: ["b"], offset: 1 };
  assert.throws(
    () => parseSafetensors(file(text + " "), { scanHeader: () => said }),
    (e: ServiceError) => e.status === 400 && JSON.stringify(e.issues?.[0]?.path) === '["b"]',
  );
  // A scan with nothing to report (null) is trusted; one that returns nothing leaves it to the
  // parser, which finds the real repeat.
  const twice = text.slice(0, -1) + ',"__metadata__":{"k":"1","k":"2"}}';
  assert.doesNotThrow(() => parseSafetensors(file(twice), { scanHeader: () => null }));
  assert.throws(
    () => parseSafetensors(file(twice + "  "), { scanHeader: () => {} }),
    (e: ServiceError) => JSON.stringify(e.issues?.[0]?.path) === '["__metadata__","k"]',
  );
});
