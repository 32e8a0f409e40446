import assert from "node:assert/strict";
import { toFloat32 } from "../../core/data.ts";
import { ServiceError } from "../../core/errors.ts";
import { FP8_E4M3_TABLE } from "../../core/dtype.ts";
import {
  rawFromJson,
  rawFromSafetensors,
  toCacheTensor,
  toDataTensor,
  toIntTensor,
  toJsonTensor,
} from "../../wire/tensors.ts";

function fails(fn: () => unknown, status: number, code: string, path: (string | number)[]): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ServiceError, `not a ServiceError: ${e}`);
    assert.equal(e.status, status);
    assert.equal(e.code, code);
    assert.deepEqual(e.issues?.[0].path, path);
    return true;
  });
}

const b64 = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength).toBase64();

Deno.test("tensors: data tensors round to their dtype, from data and from base64", () => {
  const x = Array.from({ length: 12 }, () => Math.random() * 4 - 2);
  const f16 = toDataTensor(rawFromJson({ dtype: "float16", shape: [3, 4], data: x }, ["q"]), ["q"]);
  assert.equal(f16.dtype, "float16");
  assert.deepEqual(Array.from(toFloat32(f16.array)), x.map((v) => Math.f16round(v)));
  const bf = toDataTensor(rawFromJson({ dtype: "BF16", shape: [12], data: x }, ["q"]), ["q"]);
  assert.equal(bf.dtype, "bfloat16");
  for (let i = 0; i < 12; i++) {
    const bits = new Uint32Array(new Float32Array([toFloat32(bf.array)[i]]).buffer)[0];
    assert.equal(bits & 0xffff, 0, "bfloat16 values have zero low mantissa bits");
    assert.ok(Math.abs(toFloat32(bf.array)[i] - x[i]) <= Math.abs(x[i]) * 2 ** -8);
  }
  const h = Float16Array.from(x);
  const fromB64 = toDataTensor(
    rawFromJson({ dtype: "float16", shape: [12], base64: b64(h) }, ["q"]),
    ["q"],
  );
  assert.deepEqual(Array.from(toFloat32(fromB64.array)), Array.from(h));
  assert.equal(fromB64.encoding, "base64");
});

Deno.test("tensors: cache tensors keep storage bytes", () => {
  const x = [0.3, -1.7, 100, 500];
  const c = toCacheTensor(rawFromJson({ dtype: "fp8_e4m3", shape: [4], data: x }, ["kc"]), ["kc"]);
  assert.equal(c.dtype, "fp8_e4m3");
  assert.equal(c.bytes.length, 4);
  const back = Array.from(c.bytes, (b) => FP8_E4M3_TABLE[b]);
  assert.equal(back[3], 448, "saturates");
  assert.ok(Math.abs(back[0] - 0.3) < 0.02);
  const raw = new Uint8Array([1, 2, 3, 4, 5, 6]);
  const c2 = toCacheTensor(
    rawFromSafetensors({ dtype: "F16", shape: [3], data: raw }),
    ["kc"],
  );
  assert.equal(c2.dtype, "float16");
  assert.deepEqual(c2.bytes, raw);
});

Deno.test("tensors: int tensors from arrays, data, base64 and int64", () => {
  assert.deepEqual(
    toIntTensor(rawFromJson([[1, 2], [3, 4]], ["bt"]), ["bt"]),
    { shape: [2, 2], values: new Int32Array([1, 2, 3, 4]) },
  );
  const i64 = new BigInt64Array([0n, 5n, -1n]);
  const t = toIntTensor(rawFromJson({ dtype: "int64", shape: [3], base64: b64(i64) }, ["sm"]), [
    "sm",
  ]);
  assert.deepEqual(Array.from(t.values), [0, 5, -1]);
  const t2 = toIntTensor(rawFromJson({ dtype: "I32", shape: [2], data: [7, -3] }, ["s"]), ["s"]);
  assert.deepEqual(Array.from(t2.values), [7, -3]);
  // int64 beyond int32 → 422 naming the index.
  const big = new BigInt64Array([1n, 2n ** 40n]);
  fails(
    () =>
      toIntTensor(rawFromJson({ dtype: "int64", shape: [2], base64: b64(big) }, ["sm"]), ["sm"]),
    422,
    "invalid_batch",
    ["sm", 1],
  );
  fails(
    () => toIntTensor(rawFromJson([[0, 1], [2, 2 ** 33]], ["bt"]), ["bt"]),
    422,
    "invalid_batch",
    [
      "bt",
      1,
      1,
    ],
  );
});

Deno.test("tensors: bad inputs are 400 with the path", async (t) => {
  await t.step("element count vs shape", () => {
    fails(
      () => rawFromJson({ dtype: "float32", shape: [2, 2], data: [1, 2, 3] }, ["query"]),
      400,
      "bad_tensor",
      [
        "query",
        "data",
      ],
    );
  });
  await t.step("bad base64", () => {
    fails(
      () => rawFromJson({ dtype: "float32", shape: [1], base64: "A$==" }, ["key"]),
      400,
      "bad_base64",
      [
        "key",
        "base64",
      ],
    );
  });
  await t.step(
    "base64 is RFC 4648's, strictly (session 38's audit: these decoded as the good one)",
    () => {
      const good = new Uint8Array(new Float32Array([1.5]).buffer).toBase64(); // "AADAPw=="
      assert.deepEqual(
        Array.from(rawFromJson({ dtype: "float32", shape: [1], base64: good }, ["key"]).bytes!),
        [0, 0, 192, 63],
      );
      for (
        const [bad, re] of [
          [good.slice(0, 4) + " " + good.slice(4), /character 4 is " "/],
          [good.slice(0, 4) + "\n" + good.slice(4), /character 4 is "\\n"/],
          ["\t" + good, /character 0 is "\\t"/],
          [good.replace(/=+$/, ""), /not valid base64/], // no padding
          [good.slice(0, 5) + "B==", /not valid base64/], // nonzero pad bits
          [good.replaceAll("A", "-"), /character 0 is "-"/], // the URL alphabet
        ] as const
      ) {
        fails(
          () => rawFromJson({ dtype: "float32", shape: [1], base64: bad }, ["key"]),
          400,
          "bad_base64",
          ["key", "base64"],
        );
        assert.throws(
          () => rawFromJson({ dtype: "float32", shape: [1], base64: bad }, ["key"]),
          re,
        );
      }
    },
  );
  await t.step("base64 byte count vs shape", () => {
    fails(
      () => rawFromJson({ dtype: "float32", shape: [2], base64: "AAAAAA==" }, ["key"]),
      400,
      "bad_tensor",
      [
        "key",
        "base64",
      ],
    );
  });
  await t.step("both or neither of data/base64", () => {
    fails(() => rawFromJson({ dtype: "float32", shape: [1] }, ["v"]), 400, "bad_tensor", ["v"]);
  });
  await t.step("NaN and fractions in metadata", () => {
    fails(() => toIntTensor(rawFromJson([0, NaN], ["seq_lens"]), ["seq_lens"]), 400, "bad_tensor", [
      "seq_lens",
      1,
    ]);
    fails(
      () => toIntTensor(rawFromJson({ dtype: "int32", shape: [1], data: [1.5] }, ["s"]), ["s"]),
      400,
      "bad_tensor",
      ["s", "data", 0],
    );
  });
  await t.step("ragged arrays", () => {
    fails(() => rawFromJson([[1, 2], [3]], ["bt"]), 400, "bad_tensor", ["bt", 1]);
  });
  await t.step("wrong dtype for the role", () => {
    fails(
      () => toDataTensor(rawFromJson({ dtype: "int32", shape: [1], data: [1] }, ["q"]), ["q"]),
      400,
      "bad_tensor",
      ["q", "dtype"],
    );
    fails(
      () => toIntTensor(rawFromJson({ dtype: "float32", shape: [1], data: [1] }, ["m"]), ["m"]),
      400,
      "bad_tensor",
      ["m", "dtype"],
    );
    fails(
      () => rawFromJson({ dtype: "float64", shape: [1], data: [1] }, ["q"]),
      400,
      "bad_tensor",
      [
        "q",
        "dtype",
      ],
    );
  });
});

Deno.test("tensors: toJsonTensor encodes data or base64", () => {
  const v = new Float32Array([1, -2.5, 3.25]);
  assert.deepEqual(toJsonTensor("float32", [3], v, "data"), {
    dtype: "float32",
    shape: [3],
    data: [1, -2.5, 3.25],
  });
  const j = toJsonTensor("float16", [3], v, "base64");
  assert.deepEqual(Array.from(new Float16Array(Uint8Array.fromBase64(j.base64!).buffer)), [
    1,
    -2.5,
    3.25,
  ]);
});
