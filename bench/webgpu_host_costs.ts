/**
 * What the WebGPU API itself costs the host per call, apart from this project's code: a
 * decode-step-like launch (issue 7's sizes: a 256 KiB query, 64 KiB key and value, a 4 KiB
 * table; dispatches binding eight buffers, three of them 128 MiB like a cache's chunks; one
 * copy into a read-back buffer, mapped and awaited) timed in its parts, each variant `--calls`
 * times, medians in ms:
 * - `upload`: the `writeBuffer` calls (four separate, one of the same bytes packed, four small,
 *   a 16 B flags write) or none;
 * - `record`: encoder, an optional `clearBuffer`, one compute pass of N dispatches, the
 *   read-back copy, `finish`;
 * - `submit`: `queue.submit` (and the error scope's push and pop where the variant has one);
 * - `map`: from the submit to the mapped read-back.
 *
 * `--between-kb N` runs host work between two calls, as a server's other work lies between its
 * launches: N KiB of fresh memory written and read by JS (issue 7's decode body and answer alone
 * are 640 KiB). On Dawn over lavapipe 800 KiB made `submit` about twice as long with the same
 * commands (bench/NOTES.md v0.41): much of a real launch's `submit` is the host's cold state.
 *
 * Run: `deno run -A bench/webgpu_host_costs.ts [--runtime dawn|deno] [--calls N] [--between-kb N]
 * [--json]` (bench/gpu_machine.sh part `host-costs` on the GPU machine). bench/NOTES.md v0.38 has
 * the H100's.
 * @module
 */
import { parseArgs } from "node:util";
import { benchDevice } from "./bench_device.ts";
import { quantile } from "./http_stats.ts";
import { deviceSummary } from "../gpu/runtime_report.ts";

const { values: a } = parseArgs({
  options: {
    runtime: { type: "string" },
    calls: { type: "string", default: "400" },
    "between-kb": { type: "string", default: "0" },
    json: { type: "boolean", default: false },
  },
});

/** One variant of the launch. */
interface Variant {
  name: string;
  uploads: "separate" | "packed" | "small" | "flags" | "none";
  clear?: boolean;
  dispatches: number;
  scope?: boolean;
}

const VARIANTS: Variant[] = [
  { name: "4 writes (q, k, v, table), 5 dispatches", uploads: "separate", dispatches: 5 },
  { name: "1 write of the same bytes, 5 dispatches", uploads: "packed", dispatches: 5 },
  { name: "4 writes of 256 B, 5 dispatches", uploads: "small", dispatches: 5 },
  { name: "no write, 5 dispatches", uploads: "none", dispatches: 5 },
  { name: "16 B flags write, 5 dispatches", uploads: "flags", dispatches: 5 },
  { name: "16 B flags clearBuffer, 5 dispatches", uploads: "none", clear: true, dispatches: 5 },
  { name: "no write, 1 dispatch", uploads: "none", dispatches: 1 },
  { name: "no write, no dispatch", uploads: "none", dispatches: 0 },
  { name: "4 writes, 5 dispatches, error scope", uploads: "separate", dispatches: 5, scope: true },
];

const SIZES = { query: 262144, key: 65536, value: 65536, table: 4096 };
const NAMES = Object.keys(SIZES) as (keyof typeof SIZES)[];
const TOTAL = NAMES.reduce((n, k) => n + SIZES[k], 0);
const U = GPUBufferUsage;

const SOURCE = `@group(0) @binding(0) var<storage, read_write> out: array<u32>;
${
  ["t", "q", "k", "v", "c0", "c1", "c2"].map((n, i) =>
    `@group(0) @binding(${i + 1}) var<storage, read> ${n}: array<u32>;`
  ).join("\n")
}
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) {
  if (g.x == 0u) { out[0] = t[0] + q[0] + k[0] + v[0] + c0[0] + c1[0] + c2[0]; }
}`;

/** The buffers, the pipeline and the two bind groups (separate tensors, or ranges of one). */
function setup(dev: GPUDevice) {
  const mk = (size: number, usage = U.STORAGE | U.COPY_DST | U.COPY_SRC) =>
    dev.createBuffer({ size, usage });
  const own = Object.fromEntries(NAMES.map((k) => [k, mk(SIZES[k])])) as Record<
    keyof typeof SIZES,
    GPUBuffer
  >;
  const one = mk(TOTAL), out = mk(4096), flags = mk(16);
  const chunks = [0, 1, 2].map(() => mk(128 * 2 ** 20));
  const readback = mk(SIZES.query, U.MAP_READ | U.COPY_DST);
  const body = new Uint8Array(TOTAL).fill(1); // back to back, as a request body carries them
  const views = {} as Record<keyof typeof SIZES, Uint8Array<ArrayBuffer>>;
  let at = 0;
  for (const k of NAMES) views[k] = body.subarray(at, at += SIZES[k]);
  const module = dev.createShaderModule({ code: SOURCE });
  const pipeline = dev.createComputePipeline({
    layout: "auto",
    compute: { module, entryPoint: "main" },
  });
  const group = (inputs: GPUBufferBinding[]) =>
    dev.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: [{ buffer: out }, ...inputs, ...chunks.map((buffer) => ({ buffer }))]
        .map((resource, binding) => ({ binding, resource })),
    });
  const offsets = [SIZES.query + SIZES.key + SIZES.value, 0, SIZES.query, SIZES.query + SIZES.key];
  return {
    own,
    one,
    flags,
    readback,
    body,
    views,
    pipeline,
    separate: group(["table", "query", "key", "value"].map((k) => ({ buffer: own[k as "table"] }))),
    packed: group(
      ["table", "query", "key", "value"].map((k, i) => ({
        buffer: one,
        offset: offsets[i],
        size: SIZES[k as "table"],
      })),
    ),
  };
}

type Setup = ReturnType<typeof setup>;

/** One call of `v`: its upload, record and submit times (ms). */
function oneCall(dev: GPUDevice, s: Setup, v: Variant): [number, number, number] {
  const t0 = performance.now();
  if (v.scope) dev.pushErrorScope("validation");
  if (v.uploads === "separate") {
    for (const k of NAMES) dev.queue.writeBuffer(s.own[k], 0, s.views[k]);
  } else if (v.uploads === "packed") dev.queue.writeBuffer(s.one, 0, s.body);
  else if (v.uploads === "small") {
    for (const k of NAMES) dev.queue.writeBuffer(s.own[k], 0, s.views[k], 0, 256);
  } else if (v.uploads === "flags") dev.queue.writeBuffer(s.flags, 0, s.body, 0, 16);
  const t1 = performance.now();
  const enc = dev.createCommandEncoder();
  if (v.clear) enc.clearBuffer(s.flags);
  const pass = enc.beginComputePass();
  for (let d = 0; d < v.dispatches; d++) {
    pass.setPipeline(s.pipeline);
    pass.setBindGroup(0, v.uploads === "packed" ? s.packed : s.separate);
    pass.dispatchWorkgroups(1);
  }
  pass.end();
  enc.copyBufferToBuffer(s.own.query, 0, s.readback, 0, SIZES.query);
  const cmd = enc.finish();
  const t2 = performance.now();
  dev.queue.submit([cmd]);
  if (v.scope) dev.popErrorScope().catch(() => {});
  return [t1 - t0, t2 - t1, performance.now() - t2];
}

const median = (x: number[]) => quantile(x, 0.5);

/** Host work between calls: `kb` KiB of fresh memory written, then read; returns its sum. */
function hostWork(kb: number, seed: number): number {
  const a = new Float64Array(kb * 128);
  for (let j = 0; j < a.length; j++) a[j] = j + seed;
  let sum = 0;
  for (let j = 0; j < a.length; j++) sum += a[j];
  return sum;
}

/** `v` run `calls` times (`betweenKb` of host work after each): the medians of its parts. */
async function measure(dev: GPUDevice, s: Setup, v: Variant, calls: number, betweenKb: number) {
  const parts: number[][] = [[], [], [], []];
  let sink = 0;
  for (let i = 0; i < calls; i++) {
    const times = oneCall(dev, s, v);
    const t = performance.now();
    await s.readback.mapAsync(GPUMapMode.READ, 0, 256);
    s.readback.unmap();
    [...times, performance.now() - t].forEach((x, j) => parts[j].push(x));
    if (betweenKb > 0) sink += hostWork(betweenKb, i);
  }
  if (sink < 0) console.log(sink); // keeps the work from being optimized away
  const [upload, record, submit, map] = parts.map(median);
  return { variant: v.name, upload, record, submit, map };
}

const { device, gpu } = await benchDevice(a.runtime);
try {
  const s = setup(gpu.device), calls = Number(a.calls), betweenKb = Number(a["between-kb"]);
  const rows = [];
  for (const v of VARIANTS) rows.push(await measure(gpu.device, s, v, calls, betweenKb));
  const runtime = deviceSummary(device.report());
  if (a.json) console.log(JSON.stringify({ runtime, calls, between_kb: betweenKb, rows }));
  else {
    console.log(`runtime: ${runtime}`);
    console.log(`${calls} calls a variant, ${betweenKb} KiB of host work between; medians in ms`);
    console.log(`${"variant".padEnd(42)}  upload  record  submit     map`);
    const f = (x: number) => x.toFixed(4).padStart(7);
    for (const r of rows) {
      console.log(
        `${r.variant.padEnd(42)} ${f(r.upload)} ${f(r.record)} ${f(r.submit)} ${f(r.map)}`,
      );
    }
  }
} finally {
  device.close();
}
