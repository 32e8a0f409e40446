/**
 * Deno.serve on this thread, kept serving: when its accept loop fails (out of file descriptors,
 * `EMFILE`, once every fd holds a connection), Deno ends the server and rejects `finished`,
 * which ended the process. Here that is logged and the port is served again (backing off up to
 * 2 s while it cannot), so the service comes back as soon as connections close instead of
 * exiting. `finished` settles only after {@link ResilientServer.shutdown}.
 * @module
 */
import { type ErrorLogger, lineLogger } from "./problem.ts";

/** What main.ts and the tests use of a server. */
export interface ResilientServer {
  addr: Deno.NetAddr;
  finished: Promise<void>;
  shutdown(): Promise<void>;
}

/** Options of {@link serveResilient}. */
export interface ResilientOptions {
  port: number;
  hostname?: string;
  onListen?: (addr: { hostname: string; port: number }) => void;
  /** Share the port with other listeners (the HTTP workers; Linux). */
  reusePort?: boolean;
  log?: ErrorLogger;
}

/** Serves `handler` on `port` (0: a free one, kept across restarts); see the module doc. */
export function serveResilient(
  o: ResilientOptions,
  handler: (req: Request, info: Deno.ServeHandlerInfo) => Response | Promise<Response>,
): ResilientServer {
  const log = o.log ?? lineLogger();
  const done = Promise.withResolvers<void>();
  let stopping = false;
  let backoff = 100;
  const reusePort = o.reusePort ?? false;
  let current = Deno.serve(
    { port: o.port, hostname: o.hostname, reusePort, onListen: o.onListen },
    handler,
  );
  const addr = current.addr as Deno.NetAddr;
  const restart = () => {
    if (stopping) return done.resolve();
    try {
      current = Deno.serve(
        { port: addr.port, hostname: o.hostname, reusePort, onListen: () => {} },
        handler,
      );
      backoff = 100;
      watch(current);
    } catch (e) {
      backoff = Math.min(2000, backoff * 2);
      log(`http: cannot serve port ${addr.port} again yet; retrying in ${backoff} ms`, e);
      setTimeout(restart, backoff);
    }
  };
  const watch = (s: Deno.HttpServer) => {
    s.finished.then(
      () => stopping ? done.resolve() : restart(),
      (e) => {
        if (stopping) return done.resolve();
        log(`http: the server stopped accepting; serving port ${addr.port} again`, e);
        setTimeout(restart, backoff);
      },
    );
  };
  watch(current);
  return {
    addr,
    finished: done.promise,
    async shutdown() {
      stopping = true;
      await current.shutdown();
      await done.promise;
    },
  };
}
