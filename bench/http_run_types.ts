/**
 * What one HTTP bench run (bench/http_run.ts) is told and what it reports: its options and its
 * report.
 * @module
 */
import type { DeviceReport } from "../core/types.ts";
import type { CheckTally } from "./http_checks.ts";
import type { ClientKind } from "./http_client.ts";
import type { PollTicks } from "./http_dawn_poll.ts";
import type { PhaseCpu } from "./http_server_cpu.ts";
import type { PhaseStats } from "./http_stats.ts";
import type { HttpShape } from "./http_workload.ts";

/** How to run. */
export interface RunOptions {
  /** "auto": small on a software adapter or without a device. */
  size: "auto" | "small" | "big";
  /** Overrides of the chosen shape. */
  shape: Partial<HttpShape>;
  seed: number;
  /** Rows (token, head) checked per decode answer and per prefill answer. */
  check_rows: number;
  prefill_check_rows: number;
  /** Check a prefill chunk's whole answer when it costs at most this many multiply-adds. */
  full_prefill_limit: number;
  /**
   * Untimed decode calls before the sequential timed ones (at least 1: the cold call): the
   * server's JavaScript reaches its optimized tiers only after some hundred calls, which an
   * engine's server is past (in process on the dev VM, a decode step's validate 0.13 ms in the
   * first 200 calls, 0.05 in 1,500). 1 is the protocol before v0.7.
   */
  warmup_calls: number;
  /** Extra request headers (e.g. authorization). */
  headers: Record<string, string>;
  /** How the clients talk HTTP (default "raw": the bench's own keep-alive connection). */
  client?: ClientKind;
  log: (line: string) => void;
}

/** What one run measured and checked. */
export interface RunReport {
  url: string;
  /** Every instance's URL (`url` is the first); client c uses instance c mod N. */
  urls: string[];
  /** The bench's HTTP client (bench/http_client.ts). */
  client: ClientKind;
  device: DeviceReport;
  software: boolean;
  small: boolean;
  shape: HttpShape;
  cache?: { backend: string; storage: string; bytes: number; count: number };
  /** The server backends that answered, per phase. */
  backends: Record<string, string[]>;
  /** Round trip of the first call of each kind (untimed otherwise: cold pipelines). */
  prefill_cold_ms?: number;
  decode_cold_ms?: number;
  /** Untimed decode calls before the sequential timed ones (the first: the cold call). */
  decode_warmup_calls?: number;
  prefill?: PhaseStats;
  /** The same prefill calls on the other clients' caches, sent together. */
  prefill_fill?: PhaseStats;
  decode_sequential?: PhaseStats;
  decode_concurrent?: PhaseStats;
  /**
   * The servers' Dawn poll ticks (summed over instances) during the timed decode phases,
   * where /metrics has them (bench/http_dawn_poll.ts).
   */
  dawn_poll?: { sequential: PollTicks | null; concurrent: PollTicks | null };
  /**
   * The servers' CPU a call over each timed decode phase, warm-ups left out, where /metrics has
   * it (bench/http_server_cpu.ts).
   */
  server_cpu?: { sequential: PhaseCpu | null; concurrent: PhaseCpu | null };
  checks: { prefill: CheckTally; decode: CheckTally };
  /** The server's keep-warm state after the run (`/v1/device`), when it was asked for. */
  keep_warm?: DeviceReport["keep_warm"];
  errors: string[];
  ok: boolean;
}
