/**
 * One concurrent client of bench/http_overhead.ts, as a Web Worker: builds its requests, says
 * `{kind: "ready"}`, waits for `{kind: "go"}`, sends its calls one after another on its own
 * keep-alive connection and answers `{kind: "done", ms: [round trips]}`.
 * @module
 */
import type { Caller, ClientKind, Prepared } from "./http_client.ts";
import { call, requests, type Workload } from "./http_overhead_calls.ts";

interface Scope {
  postMessage(message: unknown): void;
  onmessage: ((e: MessageEvent) => void) | null;
}

type Message = { kind: string; url: string; calls: number; client: ClientKind; w: Workload };

const scope = self as unknown as Scope;
let calls = 0, c: Caller | undefined, rs: Prepared[] = [];
scope.onmessage = async (e: MessageEvent<Message>) => {
  if (e.data.kind === "job") {
    calls = e.data.calls;
    ({ c, rs } = requests(e.data.client, e.data.url, 8, e.data.w));
    for (let i = 0; i < 20; i++) await call(c, rs[i % rs.length]);
    scope.postMessage({ kind: "ready" });
    return;
  }
  const ms: number[] = [];
  for (let i = 0; i < calls; i++) ms.push((await call(c!, rs[i % rs.length])).total);
  c!.close();
  scope.postMessage({ kind: "done", ms });
};
