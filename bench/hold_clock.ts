/**
 * The bench's keep-warm spins (bench/main.ts): gpu/keep_warm.ts holding the GPU's clock up
 * through the whole run.
 * @module
 */
import type { WebGpuDeviceManager } from "../gpu/device.ts";
import { KEEP_WARM_DEFAULTS, KeepWarmProvider } from "../gpu/keep_warm.ts";

/**
 * Keep-warm spins (gpu/keep_warm.ts: one workgroup, two spins queued) for the whole run, so
 * the GPU's clock does not drop while a variant's pipelines compile (the H200 fell to 345 MHz
 * of 1,980 within seconds, and rows measured after a compile read 3.5-5x slow: bench/NOTES.md
 * v0.6). Off on software adapters, with `--no-keep-warm`, and where the runtime's completion
 * wait blocks (gpu/keep_warm.ts).
 */
export async function holdClock(
  mgr: WebGpuDeviceManager,
  on: boolean,
  log: (s: string) => void,
): Promise<KeepWarmProvider | null> {
  if (!on) return null;
  const warm = new KeepWarmProvider(mgr, {
    ...KEEP_WARM_DEFAULTS,
    hold_ms: 3_600_000,
    depth: 2,
    mode: "await", // no HTTP here; call 3 measured this loop at 1,980 MHz
  });
  const st = await warm.start();
  if (!st.enabled) {
    log(`keep-warm: off: ${st.reason}`);
    return null;
  }
  warm.current(); // opens the window for the whole run
  log(
    `keep-warm: spins of ${st.options.spin_iters} iterations x ${st.options.workgroups} ` +
      `workgroup, ${st.options.depth} queued, through the run (--no-keep-warm: off)`,
  );
  return warm;
}
