/**
 * `--max-attention-flops` end to end: server/main.ts started with the flag on a real port
 * refuses a call over it (422 `limit_exceeded`, the FLOPs limit alone, while the attended-keys
 * limit would let the call through) and writes nothing: a later call reads the cache as it was.
 * The flag's bad values exit 2 with a message naming the flag and the value.
 */
import assert from "node:assert/strict";
import { AttentionClient, type ForwardBody } from "../../client/client.ts";
import { HELP, parseServeArgs } from "../../server/serve_options.ts";
import { expectProblem, maxAbsDiff, rand, refAttention, to3d } from "./helpers.ts";
import { runServerToExit, spawnServer } from "./process.ts";

const H = 4, HKV = 2, D = 8;
const SPEC = {
  num_blocks: 2,
  block_size: 4,
  num_kv_heads: HKV,
  head_size: D,
  dtype: "float32" as const,
};

/** Rows of `n` tokens' K or V: [n][HKV][D], float32 values. */
const rows = (n: number) => to3d(rand(n * HKV * D).map(Math.fround), n, HKV, D);

/** A causal step of one request on block 0: `k`, `v` at positions `from`.., queries the last. */
function step(cache: string, from: number, k: number[][][], v: number[][][], q: number[]) {
  const T = k.length;
  const body: ForwardBody = {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: { dtype: "float32", shape: [T, H, D], data: q },
    key: { dtype: "float32", shape: [T, HKV, D], data: k.flat(2) },
    value: { dtype: "float32", shape: [T, HKV, D], data: v.flat(2) },
    metadata: {
      query_start_loc: [0, T],
      seq_lens: [from + T],
      block_table: [[0]],
      slot_mapping: Array.from({ length: T }, (_, i) => from + i),
    },
    kv_cache: cache,
  };
  return body;
}

Deno.test("flops limit over HTTP: refused by the FLOPs alone, the cache unchanged", async () => {
  // 3 tokens from 0: 1 + 2 + 3 = 6 attended keys, 4 x 6 x 4 heads x 8 = 768 FLOPs. The keys limit
  // is 6 (at it), the FLOPs limit 767 (one under).
  const srv = await spawnServer([
    "--no-gpu",
    "--max-attended-keys",
    "6",
    "--max-attention-flops",
    "767",
  ]);
  try {
    const client = new AttentionClient(srv.url);
    const { id } = await client.createCache(SPEC);
    // Positions 0 and 1 written by a call within both limits (3 keys, 384 FLOPs).
    const k01 = rows(2), v01 = rows(2);
    await client.forward(step(id, 0, k01, v01, rand(2 * H * D).map(Math.fround)));
    const before = await client.cacheData(id);
    const over = step(id, 0, rows(3), rows(3), rand(3 * H * D).map(Math.fround));
    const e = await expectProblem(client.forward(over), 422, "limit_exceeded");
    assert.deepEqual(e.problem.issues, [{
      path: ["metadata", "seq_lens"],
      message: "attention FLOPs 768 (4 x 6 attended keys x 4 heads x head_size 8) exceeds " +
        "max_attention_flops = 767",
    }]);
    const doc = e.problem as unknown as Record<string, unknown>;
    assert.deepEqual([doc.limit, doc.value, doc.max], ["max_attention_flops", 768, 767]);
    assert.match(e.problem.detail!, /exceeds the per-call limit max_attention_flops = 767/);
    const after = await client.cacheData(id);
    assert.deepEqual(after.key_cache.data, before.key_cache.data, "K unchanged");
    assert.deepEqual(after.value_cache.data, before.value_cache.data, "V unchanged");
    // A later call (within the limits) attends over positions 0 and 1 as the first call wrote them.
    const k2 = rows(1), v2 = rows(1), q = rand(H * D).map(Math.fround);
    const ans = await client.forward(step(id, 2, k2, v2, q));
    const ref = refAttention({ q: to3d(q, 1, H, D), k: [...k01, ...k2], v: [...v01, ...v2] });
    assert.ok(maxAbsDiff(ans.output.values, ref.out.flat(2)) < 2e-5, "reads the first call's K/V");
  } finally {
    srv.kill("SIGTERM");
    assert.equal((await srv.exited).code, 0);
  }
});

Deno.test("flops limit: the flag parses, --help states it, bad values are refused", () => {
  assert.equal(parseServeArgs([]).limits.max_attention_flops, Number.MAX_SAFE_INTEGER);
  assert.equal(
    parseServeArgs(["--max-attention-flops", "9007199254740991"]).limits.max_attention_flops,
    2 ** 53 - 1,
  );
  assert.match(HELP, /--max-attention-flops N .*4 x attended keys x\s+num_heads x head_size/s);
  assert.match(HELP, /default\s+9007199254740991 = 2\^53 - 1/);
  assert.throws(
    () => parseServeArgs(["--max-attention-flops=9007199254740992"]),
    {
      message:
        '--max-attention-flops must be at most 9007199254740991 (2^53 - 1), got "9007199254740992"',
    },
  );
  assert.throws(
    () => parseServeArgs(["--max-attention-flops=0"]),
    { message: '--max-attention-flops must be an integer >= 1, got "0"' },
  );
});

Deno.test("flops limit: a non-integer or negative --max-attention-flops exits 2 naming it", async () => {
  for (const bad of ["1.5e12", "-1", "lots"]) {
    const r = await runServerToExit(["--no-gpu", "--port", "0", `--max-attention-flops=${bad}`]);
    assert.equal(r.code, 2, r.stderr);
    assert.ok(
      r.stderr.startsWith(`--max-attention-flops must be an integer >= 1, got "${bad}"\n`),
      r.stderr,
    );
  }
});
