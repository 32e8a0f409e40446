/**
 * `--keep-warm-mode process` (gpu/keep_warm_process.ts, gpu/keep_warm_child.ts): the spinner
 * process starts with Dawn's flags, spins while pinged and stops after the hold, ends on its own
 * when its stdin closes; where Dawn finds no adapter (the CPU machines' Mesa 22.3) it is off with
 * Dawn's reason; without `--allow-run` it is off and says so; the provider reports it.
 */
import assert from "node:assert/strict";
import { KeepWarmChild } from "../../gpu/keep_warm_process.ts";
import { KEEP_WARM_DEFAULTS, KeepWarmProvider } from "../../gpu/keep_warm.ts";
import { DEFAULT_DAWN_FLAGS } from "../../gpu/runtime_options.ts";
import type { DeviceProvider, DeviceReport, GpuContext } from "../../core/types.ts";

const FLAGS = [...DEFAULT_DAWN_FLAGS];
const KNOBS = { ...KEEP_WARM_DEFAULTS, hold_ms: 300, spin_iters: 2000, depth: 2, period_ms: 2 };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A provider with a stand-in context: the process mode only needs to know there is a device. */
class StubProvider implements DeviceProvider {
  current(): GpuContext | null {
    return { lost: false } as unknown as GpuContext;
  }
  acquire(): Promise<GpuContext | null> {
    return Promise.resolve(this.current());
  }
  report(): DeviceReport {
    return { available: true } as unknown as DeviceReport;
  }
}

Deno.test("keep-warm process: spins while pinged, stops after the hold, ends with its stdin", async () => {
  const child = await KeepWarmChild.start({ ...KNOBS, flags: FLAGS });
  if (typeof child === "string") {
    // The CPU machines: Dawn's own reason, and nothing left running (the sanitizers check).
    assert.match(child, /the spinner process: Dawn/);
    console.warn(`keep-warm process: off here: ${child}`);
    return;
  }
  assert.ok(child.stats().spin_ms >= 0, JSON.stringify(child.stats())); // 0 on lavapipe
  assert.equal(child.stats().dispatches, 0, "nothing before the first use");
  const t = performance.now();
  while (performance.now() - t < 400) {
    child.ping();
    await sleep(20);
  }
  const busy = child.stats();
  assert.ok(busy.spinning, JSON.stringify(busy));
  await sleep(KNOBS.hold_ms + 300);
  const idle = child.stats();
  assert.equal(idle.spinning, false, JSON.stringify(idle));
  assert.ok(idle.dispatches >= busy.dispatches && idle.dispatches > 0, JSON.stringify(idle));
  await sleep(100);
  assert.equal(child.stats().dispatches, idle.dispatches, "no spins after the hold");
  const c0 = performance.now();
  await child.close();
  assert.ok(performance.now() - c0 < 4000, "ended on its stdin, not killed after 5 s");
});

Deno.test("keep-warm process: a child that dies says so, and close still returns", async () => {
  const child = await KeepWarmChild.start({ ...KNOBS, flags: FLAGS });
  if (typeof child === "string") return; // no adapter: the first test checked the reason
  Deno.kill(child.pid, "SIGKILL");
  const t = performance.now();
  while (!child.stats().ended && performance.now() - t < 3000) await sleep(20);
  assert.match(String(child.stats().ended), /the spinner process ended \(signal SIGKILL\)/);
  child.ping(); // a write to a dead child: nothing thrown
  await child.close();
});

Deno.test("keep-warm process: the provider reports the process mode, on or why off", async () => {
  const warm = new KeepWarmProvider(new StubProvider(), { ...KNOBS, mode: "process" }, {
    dawn_flags: FLAGS,
  });
  const st = await warm.start();
  if (!st.enabled) assert.match(String(st.reason), /the spinner process: Dawn/);
  else {
    assert.ok(st.process_adapter && st.spin_ms! >= 0, JSON.stringify(st));
    warm.current();
    await sleep(200);
    assert.ok(warm.stats().dispatches > 0 || warm.stats().spinning, JSON.stringify(warm.stats()));
  }
  assert.equal(st.options.mode, "process");
  await warm.close();
});

Deno.test("keep-warm process: without --allow-run it is off and says why", async () => {
  const mod = new URL("../../gpu/keep_warm_process.ts", import.meta.url).href;
  const code = `import { KeepWarmChild } from "${mod}";
const r = await KeepWarmChild.start({ hold_ms: 10, spin_iters: 1, workgroups: 1, depth: 1,
  period_ms: 1, mode: "process", flags: [] });
console.log(typeof r === "string" ? r : "started");`;
  const file = await Deno.makeTempFile({ dir: "/tmp", suffix: ".ts" });
  await Deno.writeTextFile(file, code);
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--no-prompt", "--allow-read", "--allow-env", file],
    stdout: "piped",
    stderr: "piped",
  }).output().finally(() => Deno.remove(file));
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.match(text, /the process mode needs --allow-run/);
});
