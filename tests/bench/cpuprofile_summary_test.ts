/** bench/cpuprofile_summary.ts on a hand-made profile: self and inclusive shares, recursion once. */
import assert from "node:assert/strict";
import { formatSummary, summarize } from "../../bench/cpuprofile_summary.ts";

const frame = (functionName: string, lineNumber: number) => ({
  functionName,
  url: "file:///x/app.ts",
  lineNumber,
});

Deno.test("cpuprofile summary: self and inclusive shares; a recursive function counted once", () => {
  // root -> a -> b -> a (recursion), root -> (idle)
  const p = {
    nodes: [
      { id: 1, callFrame: frame("(root)", -1), children: [2, 5] },
      { id: 2, callFrame: frame("a", 9), children: [3] },
      { id: 3, callFrame: frame("b", 19), children: [4] },
      { id: 4, callFrame: frame("a", 9) },
      { id: 5, callFrame: frame("(idle)", -1) },
    ],
    samples: [2, 3, 4, 4, 5, 5, 5, 5],
  };
  const s = summarize(p);
  const get = (name: string) => s.shares.find((x) => x.name === name)!;
  assert.equal(s.samples, 8);
  assert.deepEqual(get("a app.ts:10"), { name: "a app.ts:10", self: 3 / 8, inclusive: 4 / 8 });
  assert.deepEqual(get("b app.ts:20"), { name: "b app.ts:20", self: 1 / 8, inclusive: 3 / 8 });
  assert.equal(get("(idle) app.ts:0").self, 0.5);
  assert.equal(get("(root) app.ts:0").inclusive, 1);
  const lines = formatSummary(s, 2);
  assert.equal(lines[0], "8 samples");
  assert.deepEqual(lines.slice(1, 4), [
    "-- self",
    " 50.00% (idle) app.ts:0",
    " 37.50% a app.ts:10",
  ]);
});
