/**
 * A JSON number float64 cannot hold, in a field the service refuses, is quoted as the client wrote
 * it (wire/json_literals.ts): `9007199254740993` parses as ...992 and `1e400` as Infinity, and a
 * message built from the parsed value named a number never sent. A metadata integer beyond int32
 * is a 422 in either form (plain array or `{dtype, shape, data}`), whatever its size; before, a
 * plain array's value past 2^53 was a schema 400 quoting the rounded number.
 * @module
 */
import assert from "node:assert/strict";
import {
  inexactNumber,
  LITERAL_LOOKUPS,
  LITERAL_TEXT_MAX,
  literalAt,
  rememberJsonText,
} from "../../wire/json_literals.ts";
import { startServer } from "./helpers.ts";

/** A decoder forward body over an inline cache whose block table is `bt` (text, spliced in). */
function body(bt: string, layerExtra = ""): string {
  const t = (n: number) => `{"dtype":"float32","shape":[1,1,4],"data":[${[1, 2, 3, n].join(",")}]}`;
  const cache = `{"dtype":"float32","shape":[1,16,1,4],"data":[${
    new Array(64).fill(0).join(",")
  }]}`;
  return `{"layer":{"num_heads":1,"num_kv_heads":1,"head_size":4${layerExtra}},"dtype":"float32",` +
    `"query":${t(4)},"key":${t(5)},"value":${t(6)},"key_cache":${cache},"value_cache":${cache},` +
    `"metadata":{"seq_lens":[1],"query_start_loc":[0,1],"block_table":${bt},"slot_mapping":[0]}}`;
}

Deno.test("json literals: the literal at a path, only for numbers float64 changed", () => {
  const text = '{"a":[1,9007199254740993,1e400,-1e400,2.5],"b":{"c":12345678901234567890}}';
  const root = rememberJsonText(JSON.parse(text), text);
  assert.equal(literalAt(root, ["a", 1]), "9007199254740993");
  assert.equal(literalAt(root, ["a", 2]), "1e400");
  assert.equal(literalAt(root, ["a", 3]), "-1e400");
  assert.equal(literalAt(root, ["b", "c"]), "12345678901234567890");
  assert.equal(literalAt(root, ["a", 0]), undefined); // exact: the value says it
  assert.equal(literalAt(root, ["a", 4]), undefined);
  assert.equal(literalAt(root, ["a", 9]), undefined);
  assert.equal(literalAt(JSON.parse(text), ["a", 1]), undefined); // no text remembered
  // Whitespace, escaped and repeated names (the last wins, as in JSON.parse), nested skips.
  const odd = '{ "x" : [ {"s":"],}\\"", "n":[[1,2],[3]]} ] , "\\u0061" : { "b" :[ 0 , ' +
    '-12345678901234567890e0 ] }, "a": {"b": [7, 1E400]} }';
  const r2 = rememberJsonText(JSON.parse(odd), odd);
  assert.equal(literalAt(r2, ["a", "b", 1]), "1E400");
  // The lookups a text gets are bounded; later ones show the parsed value.
  const many = `[${new Array(LITERAL_LOOKUPS + 2).fill("1e400").join(",")}]`;
  const r3 = rememberJsonText(JSON.parse(many), many);
  const got = Array.from({ length: LITERAL_LOOKUPS + 2 }, (_, i) => literalAt(r3, [i]));
  assert.deepEqual(got.filter((x) => x === "1e400").length, LITERAL_LOOKUPS);
  // A text over the limit is not kept (it would only hold the body's memory).
  const big = `[9007199254740993,"${"x".repeat(LITERAL_TEXT_MAX)}"]`;
  assert.equal(literalAt(rememberJsonText(JSON.parse(big), big), [0]), undefined);
  assert.ok(inexactNumber(2 ** 53) && inexactNumber(Infinity) && !inexactNumber(2 ** 53 - 1));
});

Deno.test("json literals: over HTTP, metadata and layer values are quoted as sent", async () => {
  const srv = await startServer();
  try {
    const post = async (text: string) => {
      const r = await fetch(`${srv.url}/v1/attention/forward`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: text,
      });
      return { status: r.status, doc: await r.json() };
    };
    // The body is valid apart from the one value: 0 runs.
    assert.equal((await post(body("[[0]]"))).status, 200);
    const bigForms = [
      ["[[9007199254740993]]", ["metadata", "block_table", 0, 0], "9007199254740993"],
      [
        '{"dtype":"int64","shape":[1,1],"data":[9007199254740993]}',
        ["metadata", "block_table", "data", 0],
        "9007199254740993",
      ],
      ["[[1e400]]", ["metadata", "block_table", 0, 0], "1e400"],
      ["[[-12345678901234567890]]", ["metadata", "block_table", 0, 0], "-12345678901234567890"],
      ["[[3000000000]]", ["metadata", "block_table", 0, 0], "3000000000"],
    ] as const;
    for (const [bt, path, shown] of bigForms) {
      const { status, doc } = await post(body(bt));
      assert.equal(status, 422, `${bt}: ${JSON.stringify(doc)}`);
      assert.equal(doc.code, "invalid_batch");
      assert.deepEqual(doc.issues[0].path, path);
      assert.equal(
        doc.issues[0].message,
        `value ${shown} does not fit in int32 [-2147483648, 2147483647]`,
      );
    }
    const half = await post(body("[[1.5]]"));
    assert.equal(half.status, 400);
    assert.equal(half.doc.issues[0].message, "expected an integer, got 1.5");
    // A schema refusal quotes the literal too.
    const win = await post(body("[[0]]", ',"sliding_window":9007199254740993'));
    assert.equal(win.status, 400);
    assert.deepEqual(win.doc.issues[0].path, ["layer", "sliding_window"]);
    assert.match(win.doc.issues[0].message, /; got 9007199254740993$/);
  } finally {
    await srv.close();
  }
});
