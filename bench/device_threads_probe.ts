/**
 * `deno run -A bench/device_threads_probe.ts [--runtime dawn|deno] [--threads 1,2,4]
 * [--seconds 3] [--in-kb 412] [--out-kb 262]`: can several threads of one process each own a
 * WebGPU device on one GPU, and do their calls add up? Issue 7's throughput is bounded by the
 * one thread that owns the device (v0.13: 761-856 calls/s with Dawn; HTTP worker threads in
 * front did not scale past 2), so the next structure is several device-owning threads, which
 * needs Dawn (a Node-API addon) to work in several isolates of one process: v0.10 saw aborts
 * with Dawn in a worker and in the main isolate, maybe a collected `GPU` object.
 *
 * The main isolate loads no runtime. For each thread count it starts that many workers
 * (bench/device_threads_worker.ts), each with its own runtime and device, lets every one make a
 * checked call, then times them together: each runs decode-call-shaped work (upload, one
 * compute pass, read back) one call at a time. Prints per thread calls/s and p50, and the sum;
 * a thread's error (no adapter, a wrong read-back) is printed with its words. A process abort is
 * the other possible outcome: run it in a call of its own.
 * @module
 */
import { parseArgs } from "node:util";
import type { ThreadJob } from "./device_threads_worker.ts";
import { stderrLock } from "../gpu/runtime_stderr.ts";

interface ThreadResult {
  calls?: number;
  ms?: number;
  p50_ms?: number;
  error?: string;
}

/** Waits for the next message of `w`. */
function next(w: Worker): Promise<ThreadResult & { ready?: boolean }> {
  return new Promise((resolve) => {
    w.onmessage = (e) => resolve(e.data);
    w.onerror = (e) => {
      e.preventDefault();
      resolve({ error: `worker error: ${e.message}` });
    };
  });
}

/** One thread count: every thread's outcome. */
export async function probe(n: number, job: ThreadJob): Promise<ThreadResult[]> {
  const url = new URL("./device_threads_worker.ts", import.meta.url).href;
  const workers = Array.from({ length: n }, () => new Worker(url, { type: "module" }));
  try {
    const ready = await Promise.all(workers.map((w) => {
      const m = next(w);
      w.postMessage(job);
      return m;
    }));
    if (ready.some((r) => r.error)) return ready;
    return await Promise.all(workers.map((w) => {
      const m = next(w);
      w.postMessage("go");
      return m;
    }));
  } finally {
    for (const w of workers) w.terminate();
  }
}

async function main() {
  const { values: v } = parseArgs({
    args: Deno.args,
    options: {
      runtime: { type: "string", default: "dawn" },
      threads: { type: "string", default: "1,2,4" },
      seconds: { type: "string", default: "3" },
      "in-kb": { type: "string", default: "412" },
      "out-kb": { type: "string", default: "262" },
    },
  });
  const kb = (x: string) => Math.ceil(Number(x) * 1024 / 16) * 16;
  const job: ThreadJob = {
    runtime: v.runtime === "deno" ? "deno" : "dawn",
    stderr_lock: stderrLock(),
    in_bytes: kb(v["in-kb"]!),
    out_bytes: kb(v["out-kb"]!),
    ms: 1000 * Number(v.seconds),
  };
  console.log(
    `device threads probe: ${job.runtime}, ${job.in_bytes} B up, ${job.out_bytes} B back a call`,
  );
  for (const n of v.threads!.split(",").map(Number)) {
    const rs = await probe(n, job);
    const lines = rs.map((r, i) =>
      r.error
        ? `  thread ${i}: ERROR ${r.error}`
        : `  thread ${i}: ${r.calls} calls, ${(1000 * r.calls! / r.ms!).toFixed(0)} calls/s, ` +
          `p50 ${r.p50_ms!.toFixed(3)} ms`
    );
    const ok = rs.filter((r) => !r.error);
    const sum = ok.reduce((s, r) => s + 1000 * r.calls! / r.ms!, 0);
    console.log(`${n} threads: ${sum.toFixed(0)} calls/s in all (${ok.length} ran)`);
    for (const l of lines) console.log(l);
  }
}

if (import.meta.main) await main();
