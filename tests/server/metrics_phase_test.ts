/**
 * Per-phase forward histograms (`attn_forward_phase_seconds{backend, phase}`): the phases of
 * a GPU-style and a CPU-style `timings` land in their buckets in seconds, keys outside the
 * fixed phase list and non-finite values are not counted (bounded labels), and over a real
 * port every forward route records parse, validate, plan, the backend's phases,
 * encode_response and total once per successful call.
 */
import assert from "node:assert/strict";
import { FORWARD_PHASES, Metrics, PHASE_BUCKETS } from "../../server/metrics.ts";
import { startServer } from "./helpers.ts";
import { HeldSeq } from "./held_seq.ts";

/** `{phase: {count, sum, buckets}}` of one backend, parsed from the exposition. */
function phases(text: string, backend: string) {
  const out: Record<string, { count: number; sum: number; buckets: number[] }> = {};
  const re =
    /^attn_forward_phase_seconds_(bucket|sum|count)\{backend="([^"]*)",phase="([^"]*)"(?:,le="([^"]*)")?\} (\S+)$/gm;
  for (const m of text.matchAll(re)) {
    if (m[2] !== backend) continue;
    const e = out[m[3]] ??= { count: 0, sum: 0, buckets: [] };
    if (m[1] === "count") e.count = Number(m[5]);
    if (m[1] === "sum") e.sum = Number(m[5]);
    if (m[1] === "bucket") e.buckets.push(Number(m[5]));
  }
  return out;
}

Deno.test("metrics: phases by backend, in seconds; unknown keys and bad values not counted", () => {
  const m = new Metrics();
  m.recordPhases("WEBGPU_DECODE", {
    validate: 0.2,
    plan: 0.03,
    encode: 1.5,
    gpu_and_readback: 11,
    gpu: 0.12,
    gpu_attend: 0.1, // a sub-phase, not in the list
    plan_cached: 1, // a flag, not a time
    parse: 4,
    encode_response: 0.5,
    total: 13,
  });
  m.recordPhases("WEBGPU_DECODE", { total: 7, validate: NaN, plan: -1 });
  for (let i = 0; i < 500; i++) m.recordPhases("CPU_REFERENCE", { [`k${i}`]: i, queue: 2 });
  const text = m.render();
  const gpu = phases(text, "WEBGPU_DECODE");
  assert.deepEqual(
    Object.keys(gpu).sort(),
    ["encode", "encode_response", "gpu", "gpu_and_readback", "parse", "plan", "total", "validate"],
  );
  assert.equal(gpu.total.count, 2);
  assert.ok(Math.abs(gpu.total.sum - 0.02) < 1e-12, `total sum ${gpu.total.sum}`);
  assert.equal(gpu.validate.count, 1, "NaN not counted");
  assert.equal(gpu.plan.count, 1, "negative not counted");
  // 11 ms: not under 10 ms, under 25 ms; buckets are cumulative, +Inf is the count.
  const le = [...PHASE_BUCKETS, Infinity];
  const b = gpu.gpu_and_readback.buckets;
  assert.equal(b.length, le.length);
  le.forEach((x, i) => assert.equal(b[i], x >= 0.011 ? 1 : 0, `le ${x}`));
  const cpu = phases(text, "CPU_REFERENCE");
  assert.deepEqual(Object.keys(cpu), ["queue"]);
  assert.equal(cpu.queue.count, 500);
  const labels = new Set([...text.matchAll(/phase="([^"]*)"/g)].map((x) => x[1]));
  assert.ok([...labels].every((p) => (FORWARD_PHASES as readonly string[]).includes(p)));
});

Deno.test("metrics: every forward route records its phases once per successful call", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("m", HeldSeq.cacheSpec());
    const seq = new HeldSeq();
    await srv.client.forwardOn("m", seq.step(4).body);
    await srv.client.forwardOn("m", seq.step(1).body, { binary: true });
    await srv.client.forward({ ...seq.step(1).body, kv_cache: "m" });
    await srv.client.forward({ ...seq.step(1).body, kv_cache: "nope" }).catch(() => {}); // 404
    const text = await (await fetch(`${srv.url}/metrics`)).text();
    assert.match(text, /# TYPE attn_forward_phase_seconds histogram/);
    const cpu = phases(text, "CPU_REFERENCE");
    const want = [
      "attend",
      "encode_response",
      "parse",
      "plan",
      "queue",
      "total",
      "validate",
      "write",
    ];
    assert.deepEqual(Object.keys(cpu).sort(), want);
    for (const p of want) {
      assert.equal(cpu[p].count, 3, `${p}: one per successful call`);
      assert.ok(cpu[p].sum >= 0 && cpu[p].sum < 30, `${p} sum ${cpu[p].sum}`);
    }
    assert.ok(cpu.total.sum >= cpu.attend.sum, "total covers the backend's phases");
  } finally {
    await srv.close();
  }
});
