/**
 * The service's own HTTP/1.1 server on `Deno.listen` (`--http-engine http1`): the same handler
 * as under Deno.serve, with less between the socket and it. Each request becomes a Request
 * without a body stream; its body is read when the handler asks (body_read.ts
 * `setBodySource`), straight from the socket into the buffer it ends up in, and answers built
 * from bytes are written from those bytes (http1_write.ts). A bare handler on Deno.listen took
 * a fifth of Deno.serve's server CPU for a decode-sized exchange (412 KB in, 262 KB out; 2-core
 * dev VM). With the service's handler on an H100 host one client's decode step was faster (p50
 * 1.09-1.29 ms against 1.35-2.00 in most pairs, bench/NOTES.md v0.29), and 8 clients without
 * keep-warm were served at 1,352-1,425 calls/s against Deno.serve's 1,027-1,072, but half of
 * those runs stalled ~400 ms (616-667 calls/s, v0.30). v0.31 found such stalls on lavapipe to be
 * Deno freeing Dawn's poll functions, now made fewer (gpu/dawn_tick_pace.ts), and saw none in 16
 * H100 runs, with or without that change: it stays opt-in, for one client's latency and for what
 * it bounds and answers.
 *
 * What a server owes its clients is kept: keep-alive (HTTP/1.1 by default, HTTP/1.0 when
 * asked), pipelined requests answered in order, `Expect: 100-continue`, chunked request
 * bodies, HEAD, and problems (RFC 9457, as every other answer) for heads it refuses
 * (http1_head.ts), after which it closes. It also bounds what Deno.serve does not: the time
 * for a head ({@link HEAD_TIMEOUT_SETTING}), an idle keep-alive connection's life
 * ({@link IDLE_TIMEOUT_SETTING}) and the connections open at once ({@link MAX_CONNECTIONS_SETTING}:
 * one more gets a 503 and is closed). A request whose client goes away aborts its signal.
 * Methods are case-sensitive: `get` is not `GET` (501). The answers it gives itself are counted
 * in the metrics it is given, as the handler counts its own (http1_refusals.ts).
 *
 * The parts live beside it: its settings (http1_settings.ts, re-exported here), the reads of a
 * connection (http1_reader.ts), one request and its answer (http1_exchange.ts), the answers it
 * gives itself (http1_refusals.ts) and the writes (http1_write.ts).
 * @module
 */
import { readSetting } from "../core/env.ts";
import { type ErrorLogger, lineLogger } from "./problem.ts";
import { parseHead } from "./http1_head.ts";
import { ConnReader } from "./http1_reader.ts";
import {
  closeQuietly,
  refuse,
  refuseHead,
  type RequestCounts,
  sentMethod,
  timeoutProblem,
  TOO_LARGE,
} from "./http1_refusals.ts";
import type { ResilientServer } from "./serve_resilient.ts";
import { exchange, type Handler, type Shared } from "./http1_exchange.ts";
import {
  HEAD_TIMEOUT_SETTING,
  IDLE_TIMEOUT_SETTING,
  MAX_CONNECTIONS_SETTING,
} from "./http1_settings.ts";

export { HEAD_TIMEOUT_SETTING, IDLE_TIMEOUT_SETTING, MAX_CONNECTIONS_SETTING };

interface Conn {
  conn: Deno.Conn;
  /** Between requests (safe to close at shutdown). */
  idle: boolean;
  /** The connection's number (in trace lines). */
  id: number;
}

/** Serves `handler` on `o.port` with this module's server; see the module doc. */
export function serveHttp1(
  o: {
    port: number;
    hostname?: string;
    /** Share the port with other listeners (the HTTP workers: worker_front.ts). */
    reusePort?: boolean;
    /**
     * Where the connections open at once are counted, shared by the servers of one port (the
     * HTTP workers'), so that ATTN_HTTP_MAX_CONNECTIONS caps the port, not each worker: word 0
     * of a SharedArrayBuffer's Int32s is the port's count, word `slot` this server's share (what
     * the front takes back if the worker dies). Default: this server's own count.
     */
    openConnections?: { words: Int32Array; slot: number };
    onListen?: (a: { hostname: string; port: number }) => void;
    log?: ErrorLogger;
    /** Where the answers it gives itself are counted (the handler's Metrics; none: not counted). */
    metrics?: RequestCounts;
    /** The instance name those answers carry, as the handler's do (`X-Attention-Instance`). */
    instance?: string;
  },
  handler: Handler,
): ResilientServer {
  const log = o.log ?? lineLogger();
  const limits = { // checked at start-up (serve_env.ts): a bad value throws here only in a library
    idleMs: readSetting(IDLE_TIMEOUT_SETTING),
    headMs: readSetting(HEAD_TIMEOUT_SETTING),
    maxConns: readSetting(MAX_CONNECTIONS_SETTING),
  };
  const listener = Deno.listen({
    port: o.port,
    hostname: o.hostname ?? "0.0.0.0",
    ...(o.reusePort ? { reusePort: true } : {}),
  });
  const addr = listener.addr as Deno.NetAddr;
  o.onListen?.({ hostname: addr.hostname, port: addr.port });
  const conns = new Set<Conn>();
  const open = o.openConnections ?? { words: new Int32Array(2), slot: 1 };
  let stopping = false;
  const own = { counts: o.metrics, instance: o.instance };
  const shared: Shared = { handler, limits, stopping: () => stopping, log, own };
  const allClosed = Promise.withResolvers<void>();
  const accepting = (async () => {
    let backoff = 10;
    for (;;) {
      let conn: Deno.Conn;
      try {
        conn = await listener.accept();
        backoff = 10;
      } catch (e) {
        if (stopping) return;
        log(`http: accept failed; retrying in ${backoff} ms`, e);
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(2000, backoff * 2);
        continue;
      }
      if (Atomics.add(open.words, 0, 1) >= limits.maxConns) {
        Atomics.sub(open.words, 0, 1);
        refuse(conn, limits.maxConns, shared.own);
        continue;
      }
      Atomics.add(open.words, open.slot, 1);
      const c: Conn = { conn, idle: true, id: ++connIds };
      conns.add(c);
      serveConn(c, shared).finally(() => {
        Atomics.sub(open.words, open.slot, 1);
        Atomics.sub(open.words, 0, 1);
        conns.delete(c);
        if (stopping && conns.size === 0) allClosed.resolve();
      });
    }
  })();
  return {
    addr,
    finished: allClosed.promise,
    async shutdown() {
      if (stopping) return await allClosed.promise;
      stopping = true;
      listener.close();
      await accepting;
      for (const c of conns) if (c.idle) closeQuietly(c.conn);
      if (conns.size === 0) allClosed.resolve();
      await allClosed.promise;
    },
  };
}

/** Connections accepted so far (their ids in `ATTN_TRACE_FILE` lines). */
let connIds = 0;

async function serveConn(c: Conn, s: Shared): Promise<void> {
  const { conn } = c;
  const { limits, own } = s;
  try {
    (conn as Deno.TcpConn).setNoDelay(true);
  } catch { /* not TCP */ }
  const r = new ConnReader(conn);
  try {
    for (;;) {
      c.idle = true;
      if (s.stopping() && r.available === 0) return;
      const end = await r.nextHead(limits.idleMs, limits.headMs);
      c.idle = false;
      if (end === "eof" || end === "idle") return;
      if (end === "timeout" || end === "too_large") {
        const p = end === "timeout" ? timeoutProblem(limits.headMs) : TOO_LARGE;
        return await refuseHead(r, p, sentMethod(r.buf.subarray(r.start, r.end)), own);
      }
      const bytes = r.buf.subarray(r.start, end);
      const head = parseHead(bytes, end - r.start);
      r.consume(end - r.start); // (the bytes stay as they are until the next read)
      if ("status" in head) return await refuseHead(r, head, sentMethod(bytes), own);
      if (!await exchange(r, head, s, c.id)) return;
    }
  } catch {
    // The connection failed (reset, closed while writing): nothing more to say on it.
  } finally {
    closeQuietly(conn);
  }
}
