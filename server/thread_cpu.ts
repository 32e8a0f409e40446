/**
 * CPU time, read at scrape time for /metrics (server/metrics_pools.ts): this thread's
 * (`process.threadCpuUsage()`: on Linux in the kernel's 10 ms ticks) and the whole process's
 * (`process.cpuUsage()`, microseconds). Deno's own file reads of /proc/self need
 * `--allow-all`; these need no permission. The HTTP bench divides their growth over a phase by
 * its calls: the serving thread's CPU time a call, which a busy host's waits do not inflate as
 * they do wall time (bench/http_server_cpu.ts).
 * @module
 */
import process from "node:process";

/** CPU seconds used so far by this thread and by the process. */
export interface CpuSeconds {
  thread: number;
  process: number;
}

const seconds = (u: { user: number; system: number }) => (u.user + u.system) / 1e6;

/** This thread's and the process's user + system CPU seconds; null where unreadable. */
export function cpuSeconds(): CpuSeconds | null {
  try {
    const thread = seconds(process.threadCpuUsage()), all = seconds(process.cpuUsage());
    return Number.isFinite(thread) && Number.isFinite(all) ? { thread, process: all } : null;
  } catch {
    return null;
  }
}
