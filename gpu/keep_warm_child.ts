/**
 * The keep-warm spinner as a process of its own (`--keep-warm-mode process`; the parent side is
 * gpu/keep_warm_process.ts). The GPU's clock belongs to the card, not to a device, so spins
 * submitted here from a Dawn device of this process hold it up for the server's device, and
 * their waits and timers run on this process's thread instead of the serving one (v0.9 on the
 * H200: the in-thread timer's ticks doubled the server's body parse time; bench/NOTES.md).
 *
 * Protocol. The one argument is a JSON {@link ChildConfig}. Each chunk read from stdin re-arms
 * the hold window (`hold_ms` from now); the end of stdin (the parent closed it, or died) ends the
 * process. stdout carries JSON lines: first `{"ok":true,"adapter":...,"spin_ms":...}` or
 * `{"ok":false,"reason":...}`, then `{"spinning":bool,"dispatches":n}` each time spinning starts
 * or stops. While the window is open, every `period_ms` it submits `depth` spin dispatches of
 * `workgroups` x 64 lanes (at most two such submits in flight).
 * @module
 */
import { importDawn } from "./runtime_dawn.ts";
import { KEEP_WARM } from "./keep_warm_options.ts";
import { bindingDecls } from "./kernel.ts";

/** What the parent passes (the keep-warm knobs the child uses, and Dawn's flags). */
export interface ChildConfig {
  hold_ms: number;
  spin_iters: number;
  workgroups: number;
  depth: number;
  period_ms: number;
  flags: string[];
}

const out = new TextEncoder();
const say = (o: Record<string, unknown>) => {
  Deno.stdout.writeSync(out.encode(JSON.stringify(o) + "\n"));
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Dawn's GPU object: it must outlive the device (collected, it took the process down). */
const keep: GPU[] = [];

async function device(flags: string[]): Promise<{ device: GPUDevice; adapter: string } | string> {
  try {
    const gpu = (await importDawn()).create(flags);
    keep.push(gpu);
    const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
    if (!adapter) return "Dawn found no adapter";
    const i = adapter.info;
    return {
      device: await adapter.requestDevice(),
      adapter: `${i.vendor} ${i.description}`.trim(),
    };
  } catch (e) {
    return `Dawn: ${e instanceof Error ? e.message.split("\n")[0] : e}`;
  }
}

/** Submits `n` spins in one command buffer. */
/** Submits `n` spins in one command buffer; or why the kernel did not compile. */
async function spinner(dev: GPUDevice, c: ChildConfig): Promise<((n: number) => void) | string> {
  const consts = { iters: c.spin_iters };
  const code = bindingDecls(KEEP_WARM.bindings(consts)) + "\n" + await KEEP_WARM.source(consts);
  dev.pushErrorScope("validation");
  const module = dev.createShaderModule({ code });
  const pipeline = dev.createComputePipeline({ layout: "auto", compute: { module } });
  const sink = dev.createBuffer({ size: c.workgroups * 256, usage: GPUBufferUsage.STORAGE });
  const group = dev.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: [{ binding: 0, resource: { buffer: sink } }],
  });
  const err = await dev.popErrorScope();
  if (err) return `the spin kernel: ${err.message.split("\n")[0]}`;
  return (n) => {
    const enc = dev.createCommandEncoder();
    for (let i = 0; i < n; i++) {
      const pass = enc.beginComputePass();
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(c.workgroups);
      pass.end();
    }
    dev.queue.submit([enc.finish()]);
  };
}

/** One spin's device time (ms): 8 in one submit after a first, less an empty round trip. */
async function spinMs(dev: GPUDevice, spin: (n: number) => void): Promise<number> {
  spin(1);
  await dev.queue.onSubmittedWorkDone();
  let t = performance.now();
  await dev.queue.onSubmittedWorkDone();
  const rt = performance.now() - t;
  t = performance.now();
  spin(8);
  await dev.queue.onSubmittedWorkDone();
  return Math.max(0, performance.now() - t - rt) / 8;
}

async function main(c: ChildConfig): Promise<void> {
  const got = await device(c.flags);
  if (typeof got === "string") {
    say({ ok: false, reason: got });
    return;
  }
  const dev = got.device, spin = await spinner(dev, c);
  if (typeof spin === "string") {
    say({ ok: false, reason: spin });
    return dev.destroy();
  }
  say({ ok: true, adapter: got.adapter, spin_ms: await spinMs(dev, spin) });
  let last = -Infinity, open = true, dispatches = 0;
  let wake: (() => void) | null = null;
  const rouse = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  (async () => {
    for await (const _ of Deno.stdin.readable) {
      last = performance.now();
      rouse();
    }
    open = false;
    rouse();
  })();
  // Two submits in flight at most: each period submits `depth` spins and waits for the previous
  // period's, so the GPU always has the next spins queued (waiting for each period's own left
  // the H200 at a median 540 MHz where the in-thread timer held 1,530; NOTES v0.11).
  let previous: Promise<unknown> = Promise.resolve();
  while (open) {
    if (performance.now() - last >= c.hold_ms) {
      await previous;
      say({ spinning: false, dispatches });
      await new Promise<void>((r) => wake = r);
      if (open) say({ spinning: true, dispatches });
      continue;
    }
    const t = performance.now();
    spin(c.depth);
    dispatches += c.depth;
    const done = dev.queue.onSubmittedWorkDone();
    await previous;
    previous = done;
    await sleep(Math.max(0.2, c.period_ms - (performance.now() - t)));
  }
  await previous;
  dev.destroy();
}

if (import.meta.main) {
  await main(JSON.parse(Deno.args[0]) as ChildConfig);
  Deno.exit(0); // Dawn's handles would keep the process alive
}
