/**
 * The server side of bench/http_overhead.ts, as a Web Worker: the real handler
 * (server/handler.ts) over Deno.serve on a loopback port, in front of a stand-in service whose
 * `forward` returns a prepared f16 output at once. It measures what HTTP and the codec cost
 * with no validation, planning or GPU behind them. Messages in: `{kind: "start", floor}`
 * (floor: a bare handler that reads the body and answers fixed bytes instead), then
 * `{kind: "metrics"}` (answered with the handler's `/metrics` text) and `{kind: "stop"}`.
 * Out: `{kind: "listening", port, tid}` (tid: the thread's id), `{kind: "metrics", text}`,
 * `{kind: "stopped"}`. `start` may carry `workers`: HTTP worker threads in front of the handler's
 * thread (`--http-workers`), and `delayMs`: the stub's busy wait per call (`--stub-delay-ms`).
 * Run as a program it serves the stub on its own (`[PORT] [--floor]`).
 * @module
 */
import type { ForwardInput, ForwardOutcome } from "../wire/codec.ts";
import type { AttentionService } from "../service/service.ts";
import { createHandler } from "../server/handler.ts";
import { Metrics } from "../server/metrics.ts";
import { serveHttp } from "../server/worker_front.ts";
import { serializeSafetensors } from "../core/safetensors.ts";

interface Scope {
  postMessage(message: unknown): void;
  onmessage: ((e: MessageEvent) => void) | null;
}

/** Keeps the thread busy for `ms` (nothing else runs meanwhile). */
function busyWait(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) { /* busy */ }
}

/**
 * A service that answers every forward with a prepared output of the query's size: at once, or
 * after `delayMs` of busy waiting (the thread kept busy, as the real server's is while it polls
 * Dawn for a read-back): the stub then waits as long as a real call's server `total`, so the
 * time outside it can be compared with the real server's.
 */
export function stubService(delayMs = 0): AttentionService {
  const outputs = new Map<number, Uint8Array>();
  const forward = (input: ForwardInput): Promise<ForwardOutcome> => {
    busyWait(delayMs);
    const [T, H, D] = input.query.shape;
    const n = input.query.array.bytes.byteLength;
    let bytes = outputs.get(n);
    if (!bytes) outputs.set(n, bytes = new Uint8Array(n).fill(0x3c));
    return Promise.resolve({
      backend: "stub",
      dtype: input.query.dtype,
      num_tokens: T,
      num_heads: H,
      head_size: D,
      result: {
        output: { dtype: input.query.dtype, length: n / 2, bytes },
        lse: null,
        timings: { total: 0 },
      },
    });
  };
  return { forward } as unknown as AttentionService;
}

/** This thread's id (Linux; 0 elsewhere). */
export function threadId(): number {
  try {
    return Number(Deno.readTextFileSync("/proc/thread-self/stat").split(" ")[0]);
  } catch {
    return 0;
  }
}

/** CPU ms (user + system) a thread has used so far (Linux; NaN elsewhere). */
export function threadCpuMs(tid: number): number {
  try {
    const stat = Deno.readTextFileSync(`/proc/self/task/${tid}/stat`);
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) * 10;
  } catch {
    return NaN;
  }
}

/**
 * Serves the stub (or, with `floor`, a bare handler) on a loopback port; `workers` > 0 puts
 * that many HTTP worker threads in front (server/worker_front.ts), this thread keeping the
 * handler.
 */
export async function serveStub(
  port: number,
  floor: boolean,
  metrics: Metrics,
  onListen: (port: number) => void,
  workers = 0,
  engine: "deno" | "http1" = "deno",
  delayMs = 0,
): Promise<{ shutdown(): Promise<void> }> {
  const fixed = serializeSafetensors({
    output: { dtype: "F16", shape: [32, 32, 128], data: new Uint8Array(32 * 32 * 128 * 2) },
  });
  const handler = floor
    ? async (req: Request) => {
      await req.arrayBuffer();
      return new Response(fixed as Uint8Array<ArrayBuffer>, {
        headers: { "content-type": "application/octet-stream" },
      });
    }
    : createHandler(stubService(delayMs), { metrics });
  const listen = {
    port,
    hostname: "127.0.0.1",
    onListen: (a: { port: number }) => onListen(a.port),
  };
  return await serveHttp(
    { ...listen, workers, engine, access: {}, maxBodyBytes: 1 << 30, metrics },
    handler,
  );
}

const scope = self as unknown as Scope & { name?: string };
if (scope.name === "overhead-server") {
  const metrics = new Metrics();
  let server: { shutdown(): Promise<void> } | undefined;
  scope.onmessage = async (
    e: MessageEvent<
      {
        kind: string;
        floor?: boolean;
        workers?: number;
        engine?: "deno" | "http1";
        delayMs?: number;
      }
    >,
  ) => {
    if (e.data.kind === "start") {
      server = await serveStub(
        0,
        e.data.floor === true,
        metrics,
        (port) => scope.postMessage({ kind: "listening", port, tid: threadId() }),
        e.data.workers ?? 0,
        e.data.engine ?? "deno",
        e.data.delayMs ?? 0,
      );
    } else if (e.data.kind === "metrics") {
      scope.postMessage({ kind: "metrics", text: metrics.render() });
    } else if (e.data.kind === "stop") {
      await server?.shutdown();
      scope.postMessage({ kind: "stopped" });
    }
  };
} else if (import.meta.main) {
  // Standalone: `deno run -A bench/http_overhead_server.ts [PORT] [--floor] [--http-workers=N]
  // [--http-engine=http1]`, for
  // `bench/http_overhead.ts --url` from another process (e.g. with other V8 flags).
  const port = Number(Deno.args.find((a) => /^\d+$/.test(a)) ?? 8090);
  const workers = Number(Deno.args.find((a) => a.startsWith("--http-workers="))?.slice(15) ?? 0);
  const engine = Deno.args.includes("--http-engine=http1") ? "http1" : "deno";
  await serveStub(
    port,
    Deno.args.includes("--floor"),
    new Metrics(),
    (p) => console.log(`listening on http://127.0.0.1:${p}`),
    workers,
    engine,
  );
}
