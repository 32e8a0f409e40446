/**
 * `deno run -A bench/http_overhead.ts [--workload decode|small|prefill] [--client raw|fetch]
 * [--calls N] [--clients N] [--floor] [--no-codec] [--url URL] [--http-workers N]
 * [--http-engine deno|http1] [--stub-delay-ms MS]`: what HTTP and the wire codec
 * cost per forward call, without validation, planning or a GPU. The real handler serves from a
 * worker (bench/http_overhead_server.ts) in front of a service that answers at once; the
 * client sends the workload's calls (default issue 7's decode step: 32 x 2048, 32 q / 8 kv
 * heads, head 128, f16 safetensors both ways) on a keep-alive connection.
 *
 * Prints the codec's pieces measured in-process; the sequential round trip (split into send
 * and answer parse), the handler's own `parse` and `encode_response` means, and the CPU time
 * per call of the server's and the client's threads (Linux); then calls/s from `--clients`
 * concurrent client workers. `--floor` serves a bare Deno.serve handler instead (read the
 * body, answer fixed bytes): the floor of the HTTP stack itself. `--url` sends to a stub
 * server run apart (`deno run -A bench/http_overhead_server.ts PORT`) instead of one in-process.
 * `--http-workers N` serves through N HTTP worker threads (server/worker_front.ts); the
 * "server thread" CPU is then the handler's thread (the one that would own the GPU).
 * `--http-engine http1` serves with the service's own HTTP/1.1 server (server/http1_server.ts).
 * `--stub-delay-ms MS` has the stub busy-wait MS before each answer, as long as a real call's
 * server `total`: whether the time outside the server's total grows with the wait itself (the
 * client asleep that long) rather than with the real server's work.
 * @module
 */
import { parseArgs } from "node:util";
import { parseSafetensors } from "../core/safetensors.ts";
import { binaryResponse } from "../server/responses.ts";
import { decodeBinaryForward, forwardSafetensors } from "../wire/codec.ts";
import { CLIENT_KINDS, type ClientKind } from "./http_client.ts";
import {
  bodies,
  call,
  requests,
  type Split,
  type Workload,
  WORKLOADS,
} from "./http_overhead_calls.ts";
import { stubService, threadCpuMs, threadId } from "./http_overhead_server.ts";
import { quantile } from "./http_stats.ts";
import { startTogether } from "./http_clients.ts";

const p = quantile;
const f = (ms: number) => ms.toFixed(3);

function timeIt(label: string, n: number, fn: (i: number) => unknown): void {
  for (let i = 0; i < Math.min(n, 50); i++) fn(i);
  const t: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    fn(i);
    t.push(performance.now() - t0);
  }
  console.log(`  ${label.padEnd(44)} p50 ${f(p(t, 0.5))} ms  p90 ${f(p(t, 0.9))} ms`);
}

/** The codec's pieces, in-process. */
async function codec(w: Workload): Promise<void> {
  const bs = bodies(16, w);
  console.log(`codec in-process (request ${bs[0].byteLength} B):`);
  timeIt("client: build + serialize a body", 50, () => bodies(1, w));
  timeIt("server: decodeBinaryForward", 2000, (i) => decodeBinaryForward(bs[i % bs.length]));
  const outcome = await stubService().forward(decodeBinaryForward(bs[0]).input);
  timeIt(
    "server: forwardSafetensors + binaryResponse",
    2000,
    () => binaryResponse(forwardSafetensors(outcome), { "x-attention-backend": "stub" }),
  );
  const answer = new Uint8Array(await binaryResponse(forwardSafetensors(outcome)).arrayBuffer());
  timeIt(
    `client: parseSafetensors (answer ${answer.byteLength} B)`,
    2000,
    () => parseSafetensors(answer),
  );
}

/** A worker and a queue of its messages. */
function worker<T>(name: string, file: string): { w: Worker; next: () => Promise<T> } {
  const w = new Worker(new URL(file, import.meta.url).href, { type: "module", name });
  const queue: T[] = [], waiting: ((v: T) => void)[] = [];
  w.onmessage = (e) => waiting.length ? waiting.shift()!(e.data) : queue.push(e.data);
  const next = () =>
    queue.length ? Promise.resolve(queue.shift()!) : new Promise<T>((r) => waiting.push(r));
  return { w, next };
}

/** Mean of each forward phase in a `/metrics` text, ms. */
function phaseMeans(text: string): string {
  const sum: Record<string, number> = {}, count: Record<string, number> = {};
  const re = /attn_forward_phase_seconds_(sum|count)\{[^}]*phase="(\w+)"[^}]*\} (\S+)/g;
  for (const m of text.matchAll(re)) (m[1] === "sum" ? sum : count)[m[2]] = Number(m[3]);
  return Object.keys(sum).filter((k) => k !== "total")
    .map((k) => `${k} ${f(1000 * sum[k] / count[k])} ms`).join(", ");
}

type ServerMessage = { kind: string; port: number; tid: number; text?: string };
type Server = { w: Worker; next: () => Promise<ServerMessage> };

/** Sequential calls on one connection (`srv`: the in-process server, if any). */
async function sequential(srv: Server | null, url: string, o: Options): Promise<void> {
  const { c, rs } = requests(o.client, url, o.workload === "prefill" ? 1 : 16, o.workload);
  for (let i = 0; i < (o.workload === "prefill" ? 3 : 200); i++) await call(c, rs[i % rs.length]);
  const splits: Split[] = [], me = threadId();
  const cpu0 = [srv ? threadCpuMs(o.serverTid) : NaN, threadCpuMs(me)];
  for (let i = 0; i < o.calls; i++) splits.push(await call(c, rs[i % rs.length]));
  c.close();
  const cpu = [(srv ? threadCpuMs(o.serverTid) : NaN) - cpu0[0], threadCpuMs(me) - cpu0[1]];
  const q = (k: keyof Split, at = 0.5) => f(p(splits.map((x) => x[k]), at));
  console.log(
    `sequential ${o.calls} ${o.workload} calls, client ${o.client}` +
      `${
        o.floor ? " (floor: bare Deno.serve)" : ""
      }, ${o.httpWorkers} http workers, engine ${o.engine}, stub delay ${o.delayMs} ms: round trip p50 ${
        q("total")
      } ms, ` +
      `p90 ${q("total", 0.9)}, p99 ${q("total", 0.99)}, max ${q("total", 1)} (send ${q("send")}, ` +
      `answer parse ${q("parse")}); CPU ms per ` +
      `call: server thread ${f(cpu[0] / o.calls)}, client thread ${f(cpu[1] / o.calls)}`,
  );
  if (!srv) return;
  srv.w.postMessage({ kind: "metrics" });
  const m = await srv.next();
  if (m.text) console.log(`  handler phases (mean): ${phaseMeans(m.text)}`);
}

/**
 * Every client worker's calls at once; with the server in process, also its thread's CPU over
 * the phase (idle while the clients build their bodies), a call and as a share of the wall.
 */
async function concurrent(srv: Server | null, url: string, o: Options): Promise<void> {
  const per = Math.ceil(o.calls / o.clients);
  const workers = Array.from(
    { length: o.clients },
    () =>
      new Worker(new URL("./http_overhead_client.ts", import.meta.url).href, {
        type: "module",
        name: "overhead-client",
      }),
  );
  const job = { kind: "job", url, calls: per, client: o.client, w: o.workload };
  let done: { ms?: number[]; error?: string }[], wall: number;
  const cpu0 = srv ? threadCpuMs(o.serverTid) : NaN;
  try {
    ({ done, wall_ms: wall } = await startTogether<{ ms?: number[]; error?: string }>(
      workers,
      workers.map(() => job),
      (error) => ({ error }),
    ));
  } finally {
    for (const w of workers) w.terminate();
  }
  const failed = done.find((d) => d.error !== undefined);
  if (failed) throw new Error(failed.error);
  const all = done.flatMap((d) => d.ms ?? []);
  const cpu = (srv ? threadCpuMs(o.serverTid) : NaN) - cpu0;
  console.log(
    `${o.clients} clients (workers) x ${per} calls, ${o.httpWorkers} http workers: ${
      (all.length / wall * 1000).toFixed(0)
    } ` +
      `calls/s, round trip p50 ${f(p(all, 0.5))} ms, p90 ${f(p(all, 0.9))} ms ` +
      `(${navigator.hardwareConcurrency} cores)` +
      (srv
        ? `; server thread CPU ${f(cpu / all.length)} ms a call, ${
          (100 * cpu / wall).toFixed(0)
        }% of the wall`
        : ""),
  );
}

interface Options {
  workload: Workload;
  client: ClientKind;
  calls: number;
  clients: number;
  floor: boolean;
  serverTid: number;
  httpWorkers: number;
  engine: string;
  delayMs: number;
}

async function main(): Promise<void> {
  const { values: v } = parseArgs({
    args: Deno.args,
    options: {
      workload: { type: "string", default: "decode" },
      client: { type: "string", default: "raw" },
      calls: { type: "string", default: "2000" },
      clients: { type: "string", default: "8" },
      floor: { type: "boolean", default: false },
      "no-codec": { type: "boolean", default: false },
      url: { type: "string" },
      "http-workers": { type: "string", default: "0" },
      "http-engine": { type: "string", default: "deno" },
      "stub-delay-ms": { type: "string", default: "0" },
    },
  });
  const workload = v.workload as Workload, client = v.client as ClientKind;
  if (!WORKLOADS.includes(workload)) throw new Error(`--workload: one of ${WORKLOADS}`);
  if (!CLIENT_KINDS.includes(client)) throw new Error(`--client: one of ${CLIENT_KINDS}`);
  const delayMs = Number(v["stub-delay-ms"]);
  if (!(delayMs >= 0 && delayMs <= 1000)) {
    throw new Error(`--stub-delay-ms: a number of ms from 0 to 1000, got ${v["stub-delay-ms"]}`);
  }
  if (delayMs > 0 && (v.url || v.floor)) {
    throw new Error("--stub-delay-ms: the in-process stub's wait (not with --url or --floor)");
  }
  if (!v["no-codec"] && workload !== "prefill") await codec(workload);
  let srv: Server | null = null, url = v.url ?? "", tid = 0;
  if (!url) {
    srv = worker("overhead-server", "./http_overhead_server.ts");
    const workers = Number(v["http-workers"]);
    if (!Number.isInteger(workers) || workers < 0) {
      throw new Error("--http-workers: an integer >= 0");
    }
    const engine = v["http-engine"];
    if (engine !== "deno" && engine !== "http1") throw new Error("--http-engine: deno or http1");
    srv.w.postMessage({ kind: "start", floor: v.floor, workers, engine, delayMs });
    const m = await srv.next();
    url = `http://127.0.0.1:${m.port}`;
    tid = m.tid;
  }
  const o: Options = {
    workload,
    client,
    calls: Number(v.calls),
    clients: workload === "prefill" ? 0 : Number(v.clients),
    floor: v.floor,
    serverTid: tid,
    httpWorkers: Number(v["http-workers"]),
    engine: v["http-engine"],
    delayMs,
  };
  try {
    await sequential(srv, url, o);
    if (o.clients > 0) await concurrent(srv, url, o);
  } finally {
    if (srv) {
      srv.w.postMessage({ kind: "stop" });
      await srv.next();
      srv.w.terminate();
    }
  }
}

if (import.meta.main) await main();
