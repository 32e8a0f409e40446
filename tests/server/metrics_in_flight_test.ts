/**
 * `attn_http_requests_in_flight` over a real port: a forward held on its cache and one queued
 * behind it show, with the scrape itself; once they are answered only the scrape does.
 */
import assert from "node:assert/strict";
import type { AttentionBackend } from "../../core/types.ts";
import { deferred, fakeBackend } from "../service/helpers.ts";
import { oneTokenBody, startServer } from "./helpers.ts";

const SPEC = { num_blocks: 4, block_size: 4, num_kv_heads: 2, head_size: 8, dtype: "float32" };

const inFlight = (text: string) => {
  const m = text.match(/^attn_http_requests_in_flight (\d+)$/m);
  assert.ok(m, "the gauge is in the scrape");
  return Number(m[1]);
};

Deno.test("metrics: requests in flight count a held forward, the one behind it and the scrape", async () => {
  const be = fakeBackend();
  const srv = await startServer({ backends: [be as AttentionBackend] });
  try {
    const info = await srv.client.createCache(SPEC as never);
    const scrape = async () => await (await fetch(`${srv.url}/metrics`)).text();
    assert.equal(inFlight(await scrape()), 1, "the scrape alone");
    const gate = deferred(), started = deferred();
    be.gate = gate.promise;
    be.onRunStart = () => started.resolve();
    const first = srv.client.forward(oneTokenBody(info.id, 0));
    await started.promise;
    const second = srv.client.forward(oneTokenBody(info.id, 1));
    let seen = 0;
    for (let i = 0; i < 200 && seen < 3; i++) { // the second call reaches the handler soon
      seen = inFlight(await scrape());
      if (seen < 3) await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(seen, 3, "the held call, the one queued behind it, the scrape");
    assert.match(await scrape(), /# TYPE attn_http_requests_in_flight gauge/);
    gate.resolve();
    await Promise.all([first, second]);
    assert.equal(inFlight(await scrape()), 1);
  } finally {
    await srv.close();
  }
});
