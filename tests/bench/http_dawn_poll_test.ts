/** The HTTP bench's reading of a server's Dawn poll ticks from /metrics (bench/http_dawn_poll.ts). */
import assert from "node:assert/strict";
import { pollTicksOf, ticksBetween } from "../../bench/http_dawn_poll.ts";
import { Metrics } from "../../server/metrics.ts";
import { mergeMetrics } from "../../server/metrics_merge.ts";
import { EMPTY_POOLS as POOLS } from "../support/empty_pools.ts";

const text = (immediate: number, paced: number) =>
  new Metrics({ memoryPools: () => ({ ...POOLS, dawn_poll: { immediate, paced } }) }).render();

Deno.test("http bench: poll ticks read from a server's /metrics text", () => {
  assert.deepEqual(pollTicksOf(text(900, 7)), { immediate: 900, paced: 7 });
  // Device threads: summed over the threads' samples.
  assert.deepEqual(pollTicksOf(mergeMetrics([text(900, 7), text(100, 3)])), {
    immediate: 1000,
    paced: 10,
  });
  // No pacer on the server (Deno's runtime): none.
  assert.equal(pollTicksOf(new Metrics({ memoryPools: () => POOLS }).render()), null);
});

Deno.test("http bench: ticks between two reads", () => {
  const a = { immediate: 10, paced: 1 }, b = { immediate: 25, paced: 4 };
  assert.deepEqual(ticksBetween(a, b), { immediate: 15, paced: 3 });
  assert.equal(ticksBetween(null, b), null);
  assert.equal(ticksBetween(a, null), null);
});
