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
import { WebGpuContext } from "./device.ts";
import { adapterInfoOf } from "./runtime_adapter.ts";
import { bindSpinKernel, measureSpin, type SpinKernel, submitSpins } from "./keep_warm_options.ts";

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

const why = (e: unknown) => (e instanceof Error ? e.message.split("\n")[0] : String(e));

/** A Dawn device as a context for the shared kernel cache, or why there is none. */
async function context(flags: string[]): Promise<WebGpuContext | string> {
  try {
    const gpu = (await importDawn()).create(flags);
    keep.push(gpu);
    const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
    if (!adapter) return "Dawn found no adapter";
    return new WebGpuContext(await adapter.requestDevice(), adapterInfoOf(adapter), 1);
  } catch (e) {
    return `Dawn: ${why(e)}`;
  }
}

/** The spin kernel bound on `ctx` and one spin's time (an empty wait's round trip taken off). */
async function spinner(ctx: WebGpuContext, c: ChildConfig): Promise<[SpinKernel, number] | string> {
  let k: SpinKernel;
  try {
    k = await bindSpinKernel(ctx, c.spin_iters, c.workgroups);
  } catch (e) {
    return `the spin kernel: ${why(e)}`;
  }
  const t = performance.now();
  await ctx.device.queue.onSubmittedWorkDone();
  return [k, await measureSpin(ctx.device, k, performance.now() - t)];
}

async function main(c: ChildConfig): Promise<void> {
  const ctx = await context(c.flags);
  if (typeof ctx === "string") {
    say({ ok: false, reason: ctx });
    return;
  }
  const dev = ctx.device, got = await spinner(ctx, c);
  if (typeof got === "string") {
    say({ ok: false, reason: got });
    return dev.destroy();
  }
  const [kernel, spinMs] = got, i = ctx.adapter_info;
  const spin = (n: number) => submitSpins(dev, kernel, n);
  say({ ok: true, adapter: `${i.vendor} ${i.description}`.trim(), spin_ms: spinMs });
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
