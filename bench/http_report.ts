/**
 * The HTTP bench's printed report: per runtime, the device, the shape, prefill and decode
 * numbers beside issue 7's H200 targets, the server's own per-phase timings (medians) for each
 * phase side by side, and what the checks covered; then one summary line per runtime.
 * @module
 */
import type { PollTicks } from "./http_dawn_poll.ts";
import type { PhaseCpu } from "./http_server_cpu.ts";
import type { RunReport } from "./http_run.ts";
import { type PhaseStats, timingOrder } from "./http_stats.ts";
import { BIG_SHAPE, type HttpShape } from "./http_workload.ts";

/** One runtime's outcome: a run, or why its server could not start. */
export interface RuntimeReport {
  /** The runtime asked for (`--webgpu-runtime`), or "default" / "url". */
  runtime: string;
  /** The server's `--http-workers` when the bench set it. */
  http_workers?: number;
  /** The server's `--device-threads` when the bench set it. */
  device_threads?: number;
  /** Servers started (`--instances`), when more than one. */
  instances?: number;
  available: boolean;
  /** Why the runtime is unavailable (its server's own words). */
  reason?: string;
  /** The bench could not run on an available server (e.g. /v1/device failed). */
  error?: string;
  /** The server's start-up lines (stderr) and ms to its listening line, when spawned. */
  server?: { startup_ms: number; stderr: string; exit_code?: number };
  run?: RunReport;
}

/** Issue 7's targets on the H200 (32 x 2048 decode step, 4 x 2048 prefill call, f16). */
export const TARGETS = {
  decode_p50_ms: { dawn: 1.0, deno: 13 } as Record<string, number>,
  calls_per_s: { dawn: 4000 } as Record<string, number>,
  prefill_server_ms: { dawn: 60 } as Record<string, number>,
};

/** Whether a shape is the one the targets are stated for. */
export function isTargetShape(s: HttpShape): boolean {
  return ([
    "reqs",
    "ctx",
    "num_heads",
    "num_kv_heads",
    "head_size",
    "block_size",
    "prefill_reqs",
    "prefill_tokens",
  ] as const).every((k) => s[k] === BIG_SHAPE[k]);
}

const f = (x: number | undefined) =>
  x === undefined || Number.isNaN(x) ? "-" : Math.abs(x) >= 100 ? x.toFixed(0) : x.toPrecision(3);

function target(
  kind: keyof typeof TARGETS,
  runtime: string,
  value: number | undefined,
  shape: HttpShape,
): string {
  const all = Object.entries(TARGETS[kind]).map(([r, t]) =>
    `${r} ${kind === "calls_per_s" ? ">" : "<="} ${t}`
  )
    .join(", ");
  const t = TARGETS[kind][runtime];
  if (!isTargetShape(shape) || t === undefined || value === undefined) {
    return `[H200 target: ${all}]`;
  }
  const met = kind === "calls_per_s" ? value > t : value <= t;
  return `[H200 target ${kind === "calls_per_s" ? ">" : "<="} ${t}: ${met ? "met" : "MISSED"}]`;
}

function shapeLine(s: HttpShape): string {
  return `${s.reqs} requests x ${s.ctx} context, ${s.num_heads} q / ${s.num_kv_heads} kv heads, ` +
    `head ${s.head_size}, block ${s.block_size}, f16; prefill calls of ${s.prefill_reqs} x ` +
    `${s.prefill_tokens} tokens; ${s.steps} decode steps per client; ${s.clients} clients`;
}

function timingTable(phases: [string, PhaseStats | undefined][]): string[] {
  const present = phases.filter((p): p is [string, PhaseStats] => p[1] !== undefined);
  if (present.length === 0) return [];
  const keys = timingOrder(present.flatMap(([, p]) => Object.keys(p.server)));
  const rows: string[][] = [
    ["server timing (median ms)", ...present.map(([n]) => n)],
    ...keys.map((k) => [k, ...present.map(([, p]) => f(p.server[k]))]),
    ["client round trip p50", ...present.map(([, p]) => f(p.p50_ms))],
    ["round trip - total (HTTP, codec)", ...present.map(([, p]) => f(p.outside_total_ms))],
    ["  of which not parse (HTTP, client)", ...present.map(([, p]) => f(p.outside_server_ms))],
  ];
  const w = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)));
  return rows.map((r) =>
    "  " + r.map((c, i) => i === 0 ? c.padEnd(w[i]) : c.padStart(w[i])).join("  ")
  );
}

/** A runtime's name, with its HTTP worker and instance counts when the bench set them. */
function label(r: RuntimeReport): string {
  const workers = r.http_workers === undefined ? "" : `, ${r.http_workers} http workers`;
  const threads = r.device_threads === undefined ? "" : `, ${r.device_threads} device threads`;
  const instances = r.instances === undefined ? "" : `, ${r.instances} instances`;
  return r.runtime + workers + threads + instances;
}

/** The report of one runtime, as lines. */
export function formatRuntime(r: RuntimeReport): string[] {
  const out = [`== runtime ${label(r)}`];
  if (r.server) {
    const lines = r.server.stderr.split("\n").filter((l) => /^(webgpu|runtime|dawn)/i.test(l));
    out.push(`server: up in ${f(r.server.startup_ms)} ms; ${lines.join(" | ") || "-"}`);
  }
  if (r.error !== undefined) {
    out.push(`error: ${r.error}`, "result: FAILED");
    return out;
  }
  if (!r.available || !r.run) {
    // The server's reason comes first; a usage text after it is cut.
    const why = (r.reason ?? "no run").split("\n").filter((l) => l.trim()).slice(0, 3);
    out.push(`unavailable: ${why.join(" | ")}`);
    return out;
  }
  const x = r.run, rt = x.device.runtime, s = x.shape, a = x.device.adapter;
  const dev = x.device.available
    ? `${a?.description || a?.device || "adapter"} (runtime ${rt}${x.software ? ", software" : ""})`
    : `none (${x.device.reason ?? ""})`;
  const cache = x.cache
    ? `${x.cache.count} x ${x.cache.bytes} bytes, ${x.cache.storage}, ${x.cache.backend}`
    : "-";
  const b = x.backends;
  out.push(
    `device: ${dev}`,
    `shape (${x.small ? "small" : "big"}): ${shapeLine(s)}; client: ${x.client}`,
    `caches: ${cache}; answered by: prefill ${b.prefill?.join(",") ?? "-"}, ` +
      `decode ${b.decode?.join(",") ?? "-"}`,
  );
  const p = x.prefill, pf = x.prefill_fill, d = x.decode_sequential, c = x.decode_concurrent;
  if (p) {
    const t = target("prefill_server_ms", rt, p.server.total, s);
    out.push(
      `prefill ${s.prefill_reqs}x${s.prefill_tokens} call, one at a time (${p.calls} calls): ` +
        `round trip p50 ${f(p.p50_ms)} ms, server total p50 ${f(p.server.total)} ms ${t}; ` +
        `first (cold) call ${f(x.prefill_cold_ms)} ms`,
    );
  }
  if (pf) {
    out.push(
      `prefill, the same calls on the other caches, ${s.clients} at a time: ` +
        `${f(pf.calls_per_s)} calls/s`,
    );
  }
  if (d) {
    const t = target("decode_p50_ms", rt, d.p50_ms, s);
    out.push(
      `decode step, sequential (${d.calls} calls after ${x.decode_warmup_calls ?? 1} untimed): ` +
        `p50 ${f(d.p50_ms)} ms, p99 ${f(d.p99_ms)} ms ` +
        `${t}; first (cold) call ${f(x.decode_cold_ms)} ms`,
    );
  }
  if (c) {
    const t = target("calls_per_s", rt, c.calls_per_s, s);
    out.push(
      `decode step, ${s.clients} clients (${c.calls} calls in ${f(c.wall_ms)} ms): ` +
        `${f(c.calls_per_s)} calls/s ${t}, p50 ${f(c.p50_ms)} ms, p99 ${f(c.p99_ms)} ms`,
    );
  }
  out.push(...timingTable([["prefill", p], ["decode seq", d], [`decode x${s.clients}`, c]]));
  const poll = x.dawn_poll;
  if (poll) {
    const ticks = (t: PollTicks | null, calls?: number) =>
      t
        ? `${t.immediate} at once, ${t.paced} paced` +
          (calls ? ` (${f(t.paced / calls)} paced a call)` : "")
        : "-";
    // Each concurrent client's warm-up calls fall in that phase's count too (v0.36).
    const warm = (x.decode_warmup_calls ?? 0) * s.clients;
    out.push(
      `dawn poll ticks (server): sequential phase, warm-up included, ${ticks(poll.sequential)}; ` +
        `${s.clients} clients, warm-ups included, ` +
        ticks(poll.concurrent, c?.calls === undefined ? undefined : c.calls + warm),
    );
  }
  const cpu = x.server_cpu;
  if (cpu && (cpu.sequential || cpu.concurrent)) {
    const one = (p: PhaseCpu | null) =>
      p
        ? `${f(p.thread_ms_per_call)} ms a call on the serving thread(s)` +
          (p.thread_busy === undefined ? "" : ` (busy ${f(100 * p.thread_busy)}% of the wall)`) +
          `, ${f(p.process_ms_per_call)} in the process`
        : "-";
    out.push(
      `server CPU (timed calls only): sequential ${one(cpu.sequential)}; ` +
        `${s.clients} clients ${one(cpu.concurrent)}`,
    );
  }
  const kw = x.keep_warm;
  if (kw) {
    const o = kw.options;
    out.push(
      kw.enabled
        ? `keep-warm: on, hold ${o.hold_ms} ms, spins ${o.spin_iters} x ${o.workgroups} ` +
          `workgroups, depth ${o.depth}: ${kw.dispatches} spin dispatches`
        : `keep-warm: off: ${kw.reason}`,
    );
  }
  for (const [name, t] of Object.entries(x.checks)) {
    out.push(
      `checks ${name}: ${t.calls} answers (${t.full_calls} in full), ` +
        `${t.rows_checked} of ${t.rows_total} ` +
        `(token, head) rows = ${
          f(100 * t.rows_checked / Math.max(1, t.rows_total))
        }% against float64; ` +
        `${t.failed_calls ? `${t.failed_calls} FAILED` : "all within atol 1e-2 + rtol 1e-2"}`,
    );
    for (const m of t.failures) out.push(`  mismatch: ${m}`);
  }
  for (const e of x.errors) out.push(`error: ${e}`);
  out.push(x.ok ? "result: ok" : "result: FAILED");
  return out;
}

/** One line per runtime. */
export function formatSummary(rs: RuntimeReport[]): string[] {
  const rows = [[
    "runtime",
    "decode p50 ms",
    "p99 ms",
    "calls/s (clients)",
    "prefill server ms",
    "checks",
  ]];
  for (const r of rs) {
    const x = r.run;
    if (!r.available || !x) {
      rows.push([
        label(r),
        r.error ? "error" : "unavailable",
        "",
        "",
        "",
        r.error ? "FAILED" : "",
      ]);
      continue;
    }
    rows.push([
      `${label(r)} (${x.device.runtime})`,
      f(x.decode_sequential?.p50_ms),
      f(x.decode_sequential?.p99_ms),
      `${f(x.decode_concurrent?.calls_per_s)} (${x.shape.clients})`,
      f(x.prefill?.server.total),
      x.ok ? "ok" : "FAILED",
    ]);
  }
  const w = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)));
  return rows.map((r) => r.map((c, i) => c.padEnd(w[i])).join("  "));
}
