/**
 * Exit status of a drained `--device-threads` server, over several rounds (bench/NOTES.md v0.16):
 * each round starts the server with N device threads on WebGPU, puts two caches on each thread,
 * runs a prefill and a decode step on each (answers checked against float64), sends SIGTERM and
 * records the exit status. A clean drain must exit 0; the WebGPU driver's exit-time teardown
 * racing a worker thread's showed as 134 ("double free or corruption") or 139.
 * The server inherits the environment: `ATTN_THREAD_EXIT_GRACE_MS` (server/device_threads.ts)
 * sets its grace.
 *
 * Usage: deno run -A bench/exit_probe.ts [--threads 4] [--rounds 6] [-- server args...]
 * @module
 */
import { parseArgs } from "node:util";
import { AttentionClient } from "../client/client.ts";
import { HeldSeq } from "../tests/server/held_seq.ts";
import { maxAbsDiff } from "../tests/server/helpers.ts";
import { spawnServer } from "../tests/server/process.ts";

const { values, positionals } = parseArgs({
  args: Deno.args,
  options: { threads: { type: "string", default: "4" }, rounds: { type: "string", default: "6" } },
  allowPositionals: true,
});
const threads = Number(values.threads), rounds = Number(values.rounds);
const grace = Deno.env.get("ATTN_THREAD_EXIT_GRACE_MS");
const codes: number[] = [];
for (let r = 0; r < rounds; r++) {
  const srv = await spawnServer(["--device-threads", String(threads), ...positionals]);
  const api = new AttentionClient(srv.url);
  let worst = 0;
  await Promise.all(Array.from({ length: 2 * threads }, async () => {
    const seq = new HeldSeq();
    const { id } = await api.createCache(HeldSeq.cacheSpec());
    for (const n of [5, 1]) {
      const s = seq.step(n);
      const out = await api.forwardOn(id, s.body);
      worst = Math.max(worst, maxAbsDiff(out.output.values, s.ref));
    }
  }));
  srv.kill("SIGTERM");
  const end = await srv.exited;
  codes.push(end.code);
  const tail = end.code === 0 ? "" : ` (${end.stderr.trim().split("\n").slice(-2).join(" | ")})`;
  console.log(`round ${r}: exit ${end.code}, max diff ${worst.toExponential(2)}${tail}`);
}
const bad = codes.filter((c) => c !== 0).length;
console.log(
  `${threads} threads, grace ${grace ?? "default"}: ${bad} of ${rounds} exits not 0 [${codes}]`,
);
