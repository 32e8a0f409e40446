/**
 * The HTTP bench end to end, with tiny shapes, against the real server started as a
 * subprocess by the bench's own launcher (the GPU when the machine has an adapter,
 * CPU_REFERENCE otherwise): a clean run checks every answer and passes; through a proxy that
 * corrupts chosen answers, exactly those answers are flagged (a sampled prefill answer, a
 * sampled decode answer, and one element of a fully checked decode answer); a runtime whose
 * server cannot start is reported unavailable with the server's own words; over several
 * instances (started by `--instances`, or given by `--url A,B` through counting proxies) each
 * client's caches and calls stay on its own instance.
 * @module
 */
import assert from "node:assert/strict";
import { parseSafetensors } from "../../core/safetensors.ts";
import { anyFailed, parseHttpBenchArgs, runHttpBench } from "../../bench/http_bench.ts";
import { formatRuntime } from "../../bench/http_report.ts";
import { startServer } from "../../bench/http_server.ts";

const TINY = [
  "--small",
  "--reqs=2",
  "--ctx=32",
  "--heads=4",
  "--kv-heads=2",
  "--head-size=32",
  "--prefill-reqs=2",
  "--prefill-tokens=32",
  "--steps=3",
  "--clients=2",
  "--check-rows=2",
  "--prefill-check-rows=4",
  "--warmup-calls=4",
];

/** f16 100.0: far outside any output of the bench's data (|output| < 2). */
const BAD = 0x5640;

/**
 * A proxy to `target` that corrupts the output of the forward answers numbered in `plan`
 * (0-based, in the order the proxy sees them): "all" sets every element, "last" only the last.
 */
function corruptingProxy(target: string, plan: Map<number, "all" | "last">) {
  let n = 0;
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    const url = new URL(req.url);
    const res = await fetch(`${target}${url.pathname}`, {
      method: req.method,
      headers: req.headers,
      body: req.body ? await req.arrayBuffer() : undefined,
    });
    const bytes = new Uint8Array(await res.arrayBuffer());
    if (url.pathname === "/v1/attention/forward" && res.ok) {
      const how = plan.get(n++);
      if (how) {
        const out = parseSafetensors(bytes).tensors.output.data; // a view into bytes
        const h = new Uint16Array(out.buffer, out.byteOffset, out.byteLength / 2);
        if (how === "all") h.fill(BAD);
        else h[h.length - 1] = BAD;
      }
    }
    const body = res.status === 204 ? null : bytes;
    return new Response(body, { status: res.status, headers: res.headers });
  });
  return {
    url: `http://127.0.0.1:${server.addr.port}`,
    /** Forward calls seen. */
    forwards: () => n,
    close: () => server.shutdown(),
  };
}

Deno.test("HTTP bench: every answer checked; corrupted answers are flagged", async (t) => {
  const started = await startServer([], 60_000);
  assert.ok(started.ok, started.ok ? "" : started.reason);
  const srv = started.server;
  try {
    await t.step("clean run: all answers within tolerance", async () => {
      const [r] = await runHttpBench(parseHttpBenchArgs([...TINY, `--url=${srv.url}`]));
      const x = r.run!;
      assert.equal(x.errors.length, 0, x.errors.join("; "));
      // Prefill: 1 chunk on 2 caches; decode: 3 sequential steps + 2 clients x 3 steps.
      assert.equal(x.checks.prefill.calls, 2);
      assert.equal(x.checks.decode.calls, 9);
      assert.equal(x.checks.decode.full_calls, 3, "steps 0 and 2 of client 0, step 2 of client 1");
      assert.equal(x.checks.prefill.failed_calls + x.checks.decode.failed_calls, 0);
      assert.ok(x.ok);
      assert.equal(x.decode_sequential?.calls, 3);
      assert.equal(x.decode_warmup_calls, 4);
      assert.equal(x.decode_concurrent?.calls, 6);
      assert.ok(x.decode_concurrent!.calls_per_s! > 0);
      assert.ok(typeof x.decode_sequential?.server.total === "number", "server timings came back");
      assert.match(formatRuntime(r).join("\n"), /result: ok/);
    });
    await t.step("each concurrent client warms up before the clients start", async () => {
      const proxy = corruptingProxy(srv.url, new Map());
      try {
        const [r] = await runHttpBench(parseHttpBenchArgs([...TINY, `--url=${proxy.url}`]));
        assert.ok(r.run!.ok, r.run!.errors.join("; "));
        // Prefill warm-up + 2 prefill calls; 4 warm-ups + 3 steps alone; then 2 clients x
        // (4 warm-ups + 3 timed steps), only the timed ones counted in the phase.
        assert.equal(proxy.forwards(), 3 + 7 + 2 * 7);
        assert.equal(r.run!.decode_concurrent?.calls, 6);
      } finally {
        await proxy.close();
      }
    });
    await t.step("corrupted answers: each one flagged, naming its call", async () => {
      // Forward calls in order: prefill warm-up, prefill cache 0, prefill cache 1, 4 decode
      // warm-ups (steps 2, 0, 1, 2: they end on the last step), decode steps 0, 1, 2 of client 0
      // (0 and 2 kept whole), then the clients. A corrupted warm-up answer is not checked (4:
      // step 0's twin).
      const plan = new Map([[2, "all"], [4, "all"], [8, "all"], [9, "last"]] as const);
      const proxy = corruptingProxy(srv.url, new Map(plan));
      try {
        const [r] = await runHttpBench(parseHttpBenchArgs([...TINY, `--url=${proxy.url}`]));
        const x = r.run!;
        assert.equal(x.ok, false);
        assert.equal(x.checks.prefill.failed_calls, 1);
        assert.match(x.checks.prefill.failures[0], /^prefill chunk 0 cache 1: .*got 100/);
        assert.equal(x.checks.decode.failed_calls, 2);
        const msgs = x.checks.decode.failures.join("\n");
        assert.match(msgs, /decode cache 0 step 1: .*got 100/);
        // The last element of the output: last request, last head, last element.
        assert.match(
          msgs,
          /decode cache 0 step 2 \(full\): request 1, head 3, element 31: got 100/,
        );
        assert.match(formatRuntime(r).join("\n"), /result: FAILED/);
      } finally {
        await proxy.close();
      }
    });
  } finally {
    await srv.stop();
  }
});

Deno.test("HTTP bench: a runtime whose server cannot start is reported, with why", async () => {
  const reports = await runHttpBench(
    parseHttpBenchArgs([...TINY, "--runtimes=no-such-runtime"]),
  );
  assert.equal(reports.length, 1);
  assert.equal(reports[0].available, false);
  assert.match(reports[0].reason!, /exited with code \d+ before listening: \S/);
  assert.match(formatRuntime(reports[0]).join("\n"), /unavailable: exited with code/);
  assert.ok(anyFailed(reports), "no runtime ran at all: the bench fails");
  assert.ok(
    !anyFailed([...reports, { runtime: "x", available: true, run: { ok: true } as never }]),
  );
});

Deno.test("HTTP bench: flags", () => {
  const a = parseHttpBenchArgs(["--runtimes=deno, dawn", "--steps=5", "--big"], {});
  assert.deepEqual(a.runtimes, ["deno", "dawn"]);
  assert.equal(a.httpWorkers, null);
  assert.deepEqual(parseHttpBenchArgs(["--http-workers=0, 2"], {}).httpWorkers, [0, 2]);
  assert.throws(() => parseHttpBenchArgs(["--http-workers=two"], {}), /--http-workers must be/);
  assert.equal(a.run.shape.steps, 5);
  assert.equal(a.run.warmup_calls, 1000, "the server's JIT warm before the clock");
  assert.equal(parseHttpBenchArgs(["--warmup-calls=1"], {}).run.warmup_calls, 1);
  assert.throws(() => parseHttpBenchArgs(["--warmup-calls=0"], {}), /--warmup-calls must be/);
  assert.equal(a.run.size, "big");
  assert.deepEqual(a.run.headers, {});
  assert.deepEqual(parseHttpBenchArgs([], { ATTN_TOKEN: "t" }).run.headers, {
    authorization: "Bearer t",
  });
  assert.throws(
    () => parseHttpBenchArgs(["--steps=0"], {}),
    /--steps must be a positive integer, got "0"/,
  );
  assert.throws(() => parseHttpBenchArgs(["--small", "--big"], {}), /exclude each other/);
  assert.throws(() => parseHttpBenchArgs(["--url=x", "--runtimes=deno"], {}), /exclude each other/);
  assert.deepEqual(parseHttpBenchArgs(["--url=http://a/, http://b"], {}).url, [
    "http://a",
    "http://b",
  ]);
  assert.deepEqual(parseHttpBenchArgs([], {}).instances, [1]);
  assert.deepEqual(parseHttpBenchArgs(["--device-threads=0,4"], {}).deviceThreads, [0, 4]);
  assert.throws(() => parseHttpBenchArgs(["--url=x", "--device-threads=2"], {}), /exclude/);
  assert.deepEqual(parseHttpBenchArgs(["--instances=1, 4"], {}).instances, [1, 4]);
  assert.throws(() => parseHttpBenchArgs(["--instances=0"], {}), /--instances must be/);
  assert.throws(() => parseHttpBenchArgs(["--url=x", "--instances=2"], {}), /exclude each other/);
});

Deno.test("HTTP bench: several instances, each client on its own", async (t) => {
  const started = await Promise.all([startServer([], 60_000), startServer([], 60_000)]);
  const srvs = started.map((s) => {
    assert.ok(s.ok, s.ok ? "" : s.reason);
    return s.server;
  });
  try {
    await t.step("--url A,B: client c's caches and calls on instance c mod 2", async () => {
      const proxies = srvs.map((s) => corruptingProxy(s.url, new Map()));
      try {
        const urls = proxies.map((p) => p.url).join(",");
        const [r] = await runHttpBench(parseHttpBenchArgs([...TINY, `--url=${urls}`]));
        const x = r.run!;
        assert.equal(x.errors.length, 0, x.errors.join("; "));
        assert.ok(x.ok);
        assert.deepEqual(x.urls, proxies.map((p) => p.url));
        // Client 0 (instance 0): the prefill warm-up and call, 4 decode warm-ups, 3 sequential
        // steps, then 4 warm-ups and 3 concurrent steps; client 1 (instance 1): its prefill call,
        // 4 warm-ups and 3 steps. A call on the other instance would have found no such cache
        // (404).
        assert.deepEqual(proxies.map((p) => p.forwards()), [16, 8]);
      } finally {
        await Promise.all(proxies.map((p) => p.close()));
      }
    });
  } finally {
    await Promise.all(srvs.map((s) => s.stop()));
  }
  await t.step("--instances 2 starts two servers and stops them", async () => {
    const [r] = await runHttpBench(parseHttpBenchArgs([...TINY, "--instances=2"]));
    assert.equal(r.instances, 2);
    assert.equal(r.run?.urls.length, 2);
    assert.notEqual(r.run!.urls[0], r.run!.urls[1]);
    assert.ok(r.run!.ok, r.run!.errors.join("; "));
    assert.equal(r.server?.exit_code, 0);
    assert.match(formatRuntime(r).join("\n"), /2 instances/);
  });
});
