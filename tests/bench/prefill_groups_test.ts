/**
 * The bench's prefill shapes again with other GQA groups (`BENCH_PREFILL_GQA`, bench/shapes.ts
 * `benchShapes`): query heads = kv heads x group, named so, twice the work at group 8, and not
 * matched to the anchor's SDPA rows (those ran 32 q heads).
 */
import assert from "node:assert/strict";
import { benchShapes, shapeName, work } from "../../bench/shapes.ts";

Deno.test("bench shapes: prefill again with a GQA group of 8 (64 q / 8 kv)", () => {
  const base = benchShapes(false);
  const more = benchShapes(false, false, [], [8]);
  const pre = base.filter((s) => s.kind === "prefill");
  const added = more.filter((s) => !base.some((b) => shapeName(b) === shapeName(s)));
  assert.deepEqual(
    added.map(shapeName),
    pre.map((s) => shapeName(s).replace("32q/8kv", "64q/8kv")),
  );
  for (const [i, s] of added.entries()) {
    assert.equal(s.num_heads, 64);
    assert.equal(work(s).flops, 2 * work(pre[i]).flops);
  }
  // After the f16 prefill shapes, before the mixed batch.
  const names = more.map(shapeName);
  assert.ok(names.indexOf(shapeName(added[0])) > names.indexOf(shapeName(pre.at(-1)!)));
  assert.equal(more.at(-1)!.kind, "mixed");
});

Deno.test("bench shapes: the shapes' own GQA group asked again adds nothing", () => {
  assert.deepEqual(
    benchShapes(false, false, [], [4]).map(shapeName),
    benchShapes(false).map(shapeName),
  );
  assert.deepEqual(
    benchShapes(true, false, [], [4]).map(shapeName),
    benchShapes(true).map(shapeName),
  );
});
