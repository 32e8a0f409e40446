/**
 * A 5xx answer is one log line that names its error id, which the problem document carries:
 * a forced GPU backend on a server without a device (503 `device_unavailable`) logged a stack
 * trace and an object dump, 13-15 lines, with nothing tying them to the answer (an audit). In
 * each serving mode; a device thread's line names the thread. The server here asks for a WebGPU
 * device its runtime cannot find (`DENO_WEBGPU_BACKEND` naming an API this OS has not); on a
 * `--no-gpu` server the same 503 is permanent by configuration, not a fault: not logged, no
 * error id, no `Retry-After` (a review).
 */
import assert from "node:assert/strict";
import { HeldSeq } from "./held_seq.ts";
import { spawnServer } from "./process.ts";
import { lineLogger, NOT_LOGGED, problem, toProblem } from "../../server/problem.ts";
import { ServiceError } from "../../core/errors.ts";

/** A WebGPU API this OS has none of: the runtime finds no adapter. */
const ABSENT_API = Deno.build.os === "darwin" ? "dx12" : "metal";

async function forcedGpu(mode: string[], prefix: RegExp, noGpu = false): Promise<void> {
  const srv = noGpu
    ? await spawnServer(["--no-gpu", ...mode])
    : await spawnServer(["--webgpu-runtime", "deno", ...mode], {
      DENO_WEBGPU_BACKEND: ABSENT_API,
    });
  try {
    const backends = await (await fetch(`${srv.url}/v1/backends`)).json();
    const gpu = backends.backends.find((b: { name: string }) => b.name !== "CPU_REFERENCE").name;
    const spec = HeldSeq.cacheSpec();
    const n = spec.num_blocks * spec.block_size * spec.num_kv_heads * spec.head_size;
    const cache = {
      dtype: "float32",
      shape: [spec.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size],
      data: new Array(n).fill(0),
    };
    const before = srv.stderr().length;
    const res = await fetch(`${srv.url}/v1/attention/forward`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        ...new HeldSeq().step(1).body,
        backend: gpu,
        key_cache: cache,
        value_cache: cache,
      }),
    });
    const doc = await res.json();
    assert.equal(res.status, 503, JSON.stringify(doc));
    assert.equal(doc.code, "device_unavailable");
    await new Promise((r) => setTimeout(r, 200));
    // The start-up lines about the runtimes (the one not chosen is probed in the background).
    const lines = srv.stderr().slice(before).split("\n").filter((l) =>
      l.trim() && !l.includes("webgpu: ")
    );
    if (noGpu) {
      assert.equal(doc.retryable, false, JSON.stringify(doc));
      assert.equal(doc.error_id, undefined, JSON.stringify(doc));
      assert.equal(res.headers.get("retry-after"), null);
      assert.deepEqual(lines, []);
      return;
    }
    assert.match(doc.error_id, /^[0-9a-f-]{36}$/);
    assert.ok(Number(res.headers.get("retry-after")) > 0);
    assert.equal(lines.length, 1, lines.join("\n"));
    assert.ok(lines[0].includes(doc.error_id), lines[0]);
    assert.match(lines[0], prefix);
    assert.match(lines[0], /503 device_unavailable/);
  } finally {
    srv.kill("SIGKILL");
    await srv.exited;
  }
}

Deno.test("error log: a 5xx is one line with its error id, one thread", () =>
  forcedGpu([], /^service error /));
Deno.test("error log: a 5xx is one line with its error id, HTTP workers", () =>
  forcedGpu(["--http-workers", "2"], /^service error /));
Deno.test("error log: a 5xx is one line with its error id, device threads", () =>
  forcedGpu(["--device-threads", "2"], /^device thread \d: service error /));
Deno.test("error log: --no-gpu's forced GPU backend is a permanent 503, not logged", async () => {
  for (const mode of [[], ["--http-workers", "2"], ["--device-threads", "2"]]) {
    await forcedGpu(mode, /^$/, true);
  }
});

Deno.test("error log: an unexpected error is one line, its stack joined", () => {
  const seen: string[] = [];
  const real = console.error;
  console.error = (...a: unknown[]) => void seen.push(a.map(String).join(" "));
  try {
    const doc = toProblem(new TypeError("boom"), "/v1/attention/forward", lineLogger("t: "));
    assert.equal(doc.status, 500);
    const id = /error id ([0-9a-f-]{36})/.exec(doc.detail)![1];
    assert.equal(seen.length, 1);
    assert.ok(!seen[0].includes("\n"), seen[0]);
    assert.match(seen[0], new RegExp(`^t: unexpected error ${id} on /v1/attention/forward: `));
    assert.match(seen[0], /TypeError: boom \| at /);
  } finally {
    console.error = real;
  }
});

Deno.test("error log: a multi-line message, a cause and a thrown non-Error stay on one line", () => {
  const seen: string[] = [];
  const real = console.error;
  console.error = (...a: unknown[]) => void seen.push(a.map(String).join(" "));
  try {
    const log = lineLogger("device thread 1: ");
    // A GPU validation message has several lines (Dawn's), as its ServiceError's message.
    const gpu = new ServiceError(
      "the GPU rejected the call: Buffer is destroyed.\n - While Submit",
      {
        status: 500,
        code: "gpu_validation_error",
      },
    );
    const doc = toProblem(gpu, "/v1/attention/forward", log);
    toProblem(new Error("read failed", { cause: new RangeError("offset 9") }), "/x", log);
    toProblem({ weird: true }, "/y", log);
    toProblem(problem(503, "shutting_down", "draining"), "/z", NOT_LOGGED);
    assert.equal(seen.length, 3, seen.join("\n"));
    for (const l of seen) {
      assert.ok(!l.includes("\n"), l);
      assert.match(l, /^device thread 1: /);
    }
    assert.ok(seen[0].includes(doc.error_id as string));
    assert.match(seen[0], /Buffer is destroyed\. \| - While Submit/);
    assert.match(seen[0], / \| at /, "a 500 ServiceError keeps its stack");
    assert.match(seen[1], /Error: read failed \|.* \| caused by RangeError: offset 9/);
    assert.match(seen[2], /\{ weird: true \}/);
  } finally {
    console.error = real;
  }
});
