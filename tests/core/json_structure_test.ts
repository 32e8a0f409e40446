/**
 * core/json_structure.ts: the one pass that bounds a JSON document's nesting and entries and
 * finds the first member name an object repeats (JSON.parse keeps the last and says nothing).
 */
import assert from "node:assert/strict";
import { duplicateKey, jsonPath, scanJsonStructure } from "../../core/json_structure.ts";

const bytes = (s: string) => new TextEncoder().encode(s);
const dup = (s: string) => {
  JSON.parse(s); // every case is a document JSON.parse accepts
  const d = duplicateKey(bytes(s));
  return d && jsonPath(d.path);
};

Deno.test("json structure: repeated member names, by decoded name, with their path", () => {
  assert.equal(dup('{"a":1,"a":2}'), "a");
  assert.equal(dup('{"a":1,"\\u0061":2}'), "a", "an escape spells the same name");
  assert.equal(dup('{"é":1,"é":2}'), "é");
  assert.equal(dup('{"a":{"b":1,"c":[1,{"x":1,"x":2}]}}'), "a.c[1].x");
  assert.equal(dup('{"t":[[0],[1],{"k":[{},{"d":1,"e":2,"d":3}]}]}'), "t[2].k[1].d");
  assert.equal(dup('{"__metadata__":{"request":"{}","request":"{}"}}'), "__metadata__.request");
  // The first repeat wins: a later one does not replace it.
  assert.equal(dup('{"x":{"p":1,"p":2},"x":3}'), "x.p");
});

Deno.test("json structure: no repeat where names only look alike", () => {
  for (
    const s of [
      '{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}', // the same name in different objects
      '[{"k":1},{"k":1}]',
      '{"a":"{\\"a\\":1,\\"a\\":2}","b":"a"}', // braces, quotes and commas inside strings
      '{"a,b":1,"a":2}',
      '{"a":["a","a"],"b":"a"}', // values equal to a name
      '{"A":1,"a":2}',
      "{}",
      "[]",
      '"a"',
    ]
  ) assert.equal(dup(s), null, s);
});

Deno.test("json structure: depth and entries, at the offset of the byte that passed the bound", () => {
  const deep = "[".repeat(5) + "]".repeat(5);
  assert.equal(scanJsonStructure(bytes(deep), 5).tooDeepAt, -1);
  assert.equal(scanJsonStructure(bytes(deep), 4).tooDeepAt, 4);
  assert.equal(
    scanJsonStructure(bytes('{"s":"[[[[[[[["}'), 2).tooDeepAt,
    -1,
    "brackets in a string",
  );
  assert.equal(scanJsonStructure(bytes("[1,2,3,4]"), 32, 4).tooManyAt, -1);
  assert.equal(scanJsonStructure(bytes("[1,2,3,4,5]"), 32, 4).tooManyAt, 8);
  assert.equal(
    scanJsonStructure(bytes('["1,2,3,4,5"]'), 32, 2).tooManyAt,
    -1,
    "commas in a string",
  );
});

Deno.test("json structure: a large array of numbers is scanned whole, no repeat", () => {
  const big = JSON.stringify({ query: Array.from({ length: 200_000 }, (_, i) => i / 7), q: 1 });
  const found = scanJsonStructure(bytes(big));
  assert.deepEqual(found, { tooDeepAt: -1, tooManyAt: -1, duplicate: null });
  assert.equal(dup(big.slice(0, -1) + ',"query":2}'), "query");
});

Deno.test("json structure: bytes JSON.parse refuses are scanned without an exception", () => {
  // The scan runs before the parse: a bad escape in a name threw a SyntaxError out of it (a 500
  // on /v1/kv-caches, found by the device threads' fuzz test).
  for (
    const s of ['{"\\q":1}', '{"\\u12":1,"\\u12":2}', '{"a', '{"a\\', "{{{", "]]]}", '{"a":1,"a"']
  ) scanJsonStructure(bytes(s));
});
