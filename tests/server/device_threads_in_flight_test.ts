/**
 * With device threads, an idle server's scrape shows one request in flight, the scrape, as one
 * thread does (metrics_in_flight_test.ts): the front asks every thread for its series, and each
 * thread counted that ask in `attn_http_requests_in_flight`, so an idle server of N threads showed
 * N (a load audit). The asks other than the counted one carry the front's scrape token and are
 * left out of the gauge now (server/handler.ts `notInFlight`).
 * @module
 */
import assert from "node:assert/strict";
import { spawnServer } from "./process.ts";

/** The gauge's samples in a scrape, by their labels. */
function inFlight(text: string): number[] {
  return [...text.matchAll(/^attn_http_requests_in_flight(?:\{[^}]*\})? (\d+)$/gm)].map((m) =>
    Number(m[1])
  );
}

Deno.test("device threads: an idle server's scrape counts itself once in flight", async () => {
  const srv = await spawnServer(["--device-threads", "3", "--no-gpu", "--allow-unauthenticated"]);
  try {
    for (let i = 0; i < 3; i++) {
      const text = await (await fetch(`${srv.url}/metrics`)).text();
      const samples = inFlight(text);
      assert.ok(samples.length >= 3, `a sample a thread: ${samples}`);
      assert.equal(samples.reduce((a, b) => a + b, 0), 1, `in flight: ${samples}`);
    }
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
  }
});
