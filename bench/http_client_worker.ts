/**
 * One concurrent decode client of the HTTP bench, as a Web Worker (its own thread, event loop
 * and keep-alive connection). Messages in: `{kind: "job", job}` (a {@link DecodeJob}), then
 * `{kind: "go"}` once every client said `{kind: "ready"}` (bodies built). Out: `ready`, then
 * `{kind: "done", result}` (a {@link DecodeResult}).
 * @module
 */
import { type DecodeJob, runDecode } from "./http_client.ts";

interface Scope {
  postMessage(message: unknown): void;
  onmessage: ((e: MessageEvent) => void) | null;
}

const scope = self as unknown as Scope;
let go: (() => void) | null = null;

scope.onmessage = (e: MessageEvent<{ kind: "job"; job: DecodeJob } | { kind: "go" }>) => {
  const m = e.data;
  if (m.kind === "go") {
    go?.();
    return;
  }
  const ready = () =>
    new Promise<void>((resolve) => {
      go = resolve;
      scope.postMessage({ kind: "ready" });
    });
  runDecode(m.job, ready).then(
    (result) => scope.postMessage({ kind: "done", result }),
    (e) => scope.postMessage({ kind: "done", result: { calls: [], error: String(e) } }),
  );
};
