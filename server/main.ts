/**
 * The entry point: `deno task serve [options]` (`--help` lists them). Resolves the access
 * policy (a non-loopback bind needs a token), selects the WebGPU runtime (`--webgpu-runtime
 * deno|dawn|auto`) and acquires the device (unless --no-gpu), builds the service and serves
 * it; on SIGTERM or SIGINT it stops taking calls (after a 100 ms settle window; later ones get
 * a 503 `shutting_down`), finishes the calls it took up to `--shutdown-deadline-ms`, closes the
 * listener and exits (0 when every call finished, 1 when the deadline cut some off; a second
 * signal exits 1 at once, unless within 500 ms of the first: shutdown.ts SAME_STOP_MS). Exits 2
 * on a bad command line, a refused access configuration, a bad value of a variable the GPU layer
 * or the backends read (serve_env.ts) or an explicit runtime that cannot start; 1, in one line,
 * when it cannot serve the port. With `--http-workers N` the
 * HTTP work runs on N worker threads (worker_front.ts) and this thread keeps the device and the
 * service; with `--device-threads N` it is the other way round: N worker threads each own a
 * device and a service (device_threads.ts) and this thread does the HTTP work, or, with
 * `--device-threads-http`, the device threads serve the port themselves and pass this thread
 * only what is not theirs (thread_http.ts, thread_listeners.ts). The only modules that call
 * Deno.serve are worker_front.ts (for this thread), the HTTP worker (http_worker.ts) and the
 * device threads' listener (thread_http.ts).
 * @module
 */
// The modules that load the backends (device_setup.ts, device_threads.ts) are imported once the
// environment they read passed serve_env.ts: a bad value read as they load would otherwise end
// the process with an uncaught error before --help could answer.
import type { ServingOptions } from "./device_setup.ts";
import { AccessConfigError, resolveAccess, type ResolvedAccess } from "./access_config.ts";
import { sharedJsonDecoder } from "./json_decoder.ts";
import { named } from "./responses.ts";
import { Drainer, SAME_STOP_MS } from "./shutdown.ts";
import { type HttpServer, serveHttp } from "./worker_front.ts";
import type { RequestCounts } from "./http1_refusals.ts";
import type { DeviceThreads } from "./device_threads.ts";
import type { ThreadListeners } from "./thread_listeners.ts";

import { HELP, parseServeArgs, serveEnv, type ServeOptions } from "./serve_options.ts";
import { checkServeEnv, StartupEnvError } from "./serve_env.ts";
import { EnvValueError } from "../core/env.ts";
import { BODY_TIMEOUT_ENV } from "./body_timeout.ts";

function describeAccess(a: ResolvedAccess): string {
  if (a.policy.token !== undefined) return `auth: bearer token (from ${a.tokenSource})`;
  if (a.policy.allowedHosts) {
    return `auth: none (loopback); Host: ${a.policy.allowedHosts.join(", ")}`;
  }
  return "auth: none";
}

/** The handler, and how to close what it serves with once drained. */
interface Served {
  handler: (req: Request) => Promise<Response>;
  /** Where the handler counts, for the answers given before it (serveHttp's `metrics`). */
  metrics: RequestCounts;
  close: () => Promise<void>;
  /** The device threads (`--device-threads`), for their own listeners. */
  threads?: DeviceThreads;
}

/** The options a service and its handler take, from the command line's. */
function servingOptions(o: ServeOptions, access: ResolvedAccess): ServingOptions {
  return {
    memoryBudgetBytes: o.memoryBudgetBytes,
    limits: o.limits,
    maxBodyBytes: o.maxBodyBytes,
    maxJsonBodyBytes: o.maxJsonBodyBytes,
    access: access.policy,
    ...(o.instanceName !== undefined ? { instance: o.instanceName } : {}),
  };
}

/** This thread owns the device and the service. */
async function oneService(o: ServeOptions, access: ResolvedAccess): Promise<Served> {
  const { acquireDevice, serviceAndHandler } = await import("./device_setup.ts");
  const { device, close: closeDevice } = await acquireDevice(o.gpu, o.runtime, o.keepWarm);
  const { service, handler } = serviceAndHandler(device, servingOptions(o, access));
  return {
    handler,
    metrics: handler.metrics,
    close: async () => {
      await service.close();
      sharedJsonDecoder.close();
      closeDevice();
    },
  };
}

/** `--device-threads N`: each thread its own device and service; exits 2 when one cannot start. */
async function threadedService(o: ServeOptions, access: ResolvedAccess): Promise<Served> {
  const { startDeviceThreads } = await import("./device_threads.ts");
  const started = await startDeviceThreads({
    threads: o.deviceThreads,
    init: { gpu: o.gpu, runtime: o.runtime, keepWarm: o.keepWarm, ...servingOptions(o, access) },
    access: access.policy,
  });
  if (!started.ok) {
    console.error(`cannot start ${o.deviceThreads} device threads: ${started.reason}`);
    Deno.exit(started.fatal ? 2 : 1);
  }
  console.error(`device threads: ${o.deviceThreads}`);
  return {
    handler: started.front.handler,
    metrics: started.front.metrics,
    close: () => started.front.close(),
    threads: started.front,
  };
}

/** What serves the port, and the device threads' listeners when they are what serves it. */
interface Serving {
  server: HttpServer;
  /** `--device-threads-http`: the server itself, whose threads drain their own calls. */
  listeners: ThreadListeners | null;
}

/**
 * Serves the port: on this thread, HTTP workers or the device threads; exits 1, saying why in
 * one line, when it cannot.
 */
async function serveThePort(
  o: ServeOptions,
  access: ResolvedAccess,
  serve: (req: Request) => Promise<Response>,
  { threads, metrics }: Pick<Served, "threads" | "metrics">,
): Promise<Serving> {
  const onListen = ({ hostname, port }: { hostname: string; port: number }) => {
    const h = hostname.includes(":") ? `[${hostname}]` : hostname;
    console.log(`listening on http://${h}:${port}`);
  };
  try {
    if (o.deviceThreadsHttp && threads) {
      const listeners = await threads.listen({ port: o.port, hostname: o.host, handler: serve });
      console.error(`device threads serve the port: ${threads.threads}`);
      onListen(listeners.addr);
      return { server: listeners, listeners };
    }
    const server = await serveHttp({
      engine: o.httpEngine,
      workers: o.httpWorkers,
      port: o.port,
      hostname: o.host,
      access: access.policy,
      maxBodyBytes: o.maxBodyBytes,
      maxJsonBodyBytes: o.maxJsonBodyBytes,
      onListen,
      metrics,
      instance: o.instanceName,
    }, serve);
    if (o.httpWorkers > 0) console.error(`http workers: ${o.httpWorkers}`);
    console.error(`http engine: ${o.httpEngine}`);
    return { server, listeners: null };
  } catch (e) {
    // In use, a host that does not resolve or is not this machine's: one line, in every mode.
    const what = o.deviceThreadsHttp
      ? " with the device threads serving the port"
      : o.httpWorkers > 0
      ? ` with ${o.httpWorkers} HTTP workers`
      : "";
    const host = o.host.includes(":") ? `[${o.host}]` : o.host;
    console.error(
      `cannot serve on ${host}:${o.port}${what}: ${e instanceof Error ? e.message : e}`,
    );
    Deno.exit(1);
  }
}

/**
 * On SIGINT or SIGTERM: drains this thread's calls and the device threads' own (when they serve
 * the port: the stop lines count theirs, ThreadListeners.inFlight), closes the port, then
 * `close`s and exits 0, or exits 1 at the deadline; a second signal exits 1 at once, unless it
 * came within {@link SAME_STOP_MS} of the first (the same stop, sent on by a parent).
 */
function stopOnSignals(
  o: ServeOptions,
  drainer: Drainer,
  { server, listeners }: Serving,
  close: () => Promise<void>,
): void {
  let stoppedAt = -1; // performance.now() at the first signal
  // Under --device-threads-http every call is counted by the thread that took it (tracked),
  // none by this thread's drainer: the threads' counts are read, and their drain reports what
  // it left.
  const inFlight = () => drainer.count + (listeners?.inFlight() ?? 0);
  const stop = async (sig: string) => {
    if (stoppedAt >= 0) {
      const after = performance.now() - stoppedAt;
      if (after < SAME_STOP_MS) {
        return console.error(
          `${sig} again ${after.toFixed(0)} ms after the first: the same stop (a process ` +
            `group's signal sent on by its parent, as deno task does); ` +
            `a signal ${SAME_STOP_MS} ms or more after the first exits at once`,
        );
      }
      console.error(`${sig} again: exiting now with ${inFlight()} calls unfinished`);
      Deno.exit(1);
    }
    stoppedAt = performance.now();
    const where = listeners ? " on the device threads" : "";
    console.error(
      `${sig}: stopping; finishing ${inFlight()} calls in flight${where} ` +
        `(deadline ${o.shutdownDeadlineMs} ms)`,
    );
    // The threads' drain starts first: the server's shutdown then waits for it, not another.
    const theirs = listeners?.drain(o.shutdownDeadlineMs) ??
      { drained: true, unfinished: 0, refused: 0, silent: 0 };
    // Serving threads refuse (and wait for quiet) themselves: this thread's drainer takes none.
    const mine = await drainer.drain(server, {
      deadlineMs: o.shutdownDeadlineMs,
      quietMs: listeners ? 0 : undefined,
    });
    const { drained, unfinished, refused: refusedThere, silent } = await theirs;
    if (mine.drained && drained) {
      await close();
      const n = mine.refused + refusedThere;
      const refused = n ? `; ${n} requests refused while stopping` : "";
      console.error(`stopped: every call finished (${mine.ms.toFixed(0)} ms${refused})`);
      Deno.exit(0);
    }
    const stuck = silent ? ` (${silent} device threads did not answer: their calls uncounted)` : "";
    console.error(
      `stopped at the deadline: ${mine.unfinished + unfinished} calls unfinished${stuck}`,
    );
    Deno.exit(1);
  };
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    try {
      Deno.addSignalListener(sig, () => void stop(sig));
    } catch { /* signal not supported here */ }
  }
}

/**
 * `handler` counted by `drainer`, unless the device threads serve the port: each call then
 * reaches this thread from the thread that took it, whose own drainer counts it and refuses
 * new calls once draining. Counted here too, a call passed on would be counted twice in the
 * calls left at the deadline, and one the thread took before its drain refused (a 503
 * `shutting_down`) when it reached this thread after this thread's settle window.
 */
function tracked(
  drainer: Drainer,
  handler: (req: Request) => Promise<Response>,
  o: ServeOptions,
): (req: Request) => Promise<Response> {
  return o.deviceThreadsHttp && o.deviceThreads > 0 ? handler : drainer.track(handler);
}

async function main(): Promise<void> {
  let o: ServeOptions;
  let access: ResolvedAccess;
  try {
    // --help answers whatever the environment holds (its variables are parsed below).
    if (Deno.args.some((a) => a === "--help" || a === "-h")) {
      console.log(HELP);
      return;
    }
    const env = serveEnv();
    o = parseServeArgs(Deno.args, env);
    if (o.help) {
      console.log(HELP);
      return;
    }
    await checkServeEnv(env);
    access = resolveAccess(o);
    // Every isolate that reads bodies (HTTP workers, the device-threads front) reads it here.
    Deno.env.set(BODY_TIMEOUT_ENV, String(o.bodyTimeoutMs));
  } catch (e) {
    const usage = e instanceof AccessConfigError || e instanceof StartupEnvError ||
        e instanceof EnvValueError
      ? ""
      : `\n\n${HELP}`;
    console.error(`${e instanceof Error ? e.message : e}${usage}`);
    Deno.exit(2);
  }
  if (access.warning) console.error(access.warning);
  console.error(describeAccess(access));
  if (o.instanceName !== undefined) console.error(`instance: ${o.instanceName}`);
  const served = o.deviceThreads > 0
    ? await threadedService(o, access)
    : await oneService(o, access);
  const drainer = new Drainer();
  const serving = await serveThePort(
    o,
    access,
    named(tracked(drainer, served.handler, o), o.instanceName),
    served,
  );
  stopOnSignals(o, drainer, serving, served.close);
  await serving.server.finished;
}

if (import.meta.main) await main();
