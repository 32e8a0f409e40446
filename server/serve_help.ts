/**
 * The serve command line's `--help` text and the names and defaults it states (serve_options.ts
 * parses the command line with them).
 * @module
 */
import { RUNTIME_HELP } from "../gpu/runtime_options.ts";
import { DEFAULT_CALL_LIMITS } from "../service/validate.ts";
import {
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_MAX_JSON_BODY_BYTES,
  MAX_JSON_BODY_BYTES_CEILING,
} from "./body.ts";
import { MAX_JSON_VALUES } from "../wire/json_scan.ts";
import { DEFAULT_SHUTDOWN_DEADLINE_MS } from "./shutdown.ts";
import { BODY_TIMEOUT_ENV, DEFAULT_BODY_TIMEOUT_MS } from "./body_timeout.ts";
import { MAX_TIMER_MS } from "../core/timeout.ts";
import { KEEP_WARM_DEFAULTS } from "../gpu/keep_warm.ts";

/** Default memory budget for server-held caches: 4 GiB. */
export const DEFAULT_MEMORY_BUDGET_BYTES = 4 * 1024 ** 3;

/** The environment variable of `--http-workers`. */
export const HTTP_WORKERS_ENV = "ATTN_HTTP_WORKERS";

/** The environment variable of `--http-engine`. */
export const HTTP_ENGINE_ENV = "ATTN_HTTP_ENGINE";

/** The HTTP servers `--http-engine` chooses from. */
export const HTTP_ENGINES = ["deno", "http1"] as const;

/** The environment variable of `--keep-warm-ms`. */
export const KEEP_WARM_ENV = "ATTN_KEEP_WARM_MS";

/** Default HTTP worker threads. */
export const DEFAULT_HTTP_WORKERS = 0;

/** Most HTTP worker threads, and most device threads. */
export const MAX_HTTP_WORKERS = 64;

/** The environment variable of `--device-threads`. */
export const DEVICE_THREADS_ENV = "ATTN_DEVICE_THREADS";

/** The environment variable of `--device-threads-http` (`1` or `0`). */
export const DEVICE_THREADS_HTTP_ENV = "ATTN_DEVICE_THREADS_HTTP";

/** The longest `--keep-warm-ms`, 1 hour (gpu/keep_warm_options.ts checks the same bound). */
export const MAX_KEEP_WARM_MS = 3_600_000;

export const HELP = `attention service: batched paged attention over HTTP

usage: deno task serve [options]

  --port N                  port to listen on (default 8000; 0 = any free port)
  --host H                  address to bind (default 127.0.0.1); any address that is not
                            loopback needs a token (or --allow-unauthenticated)
  --max-body-bytes B        largest request body in bytes (default ${DEFAULT_MAX_BODY_BYTES} = 512 MiB)
  --max-json-body-bytes B   largest JSON body in bytes (default ${DEFAULT_MAX_JSON_BODY_BYTES} = 64 MiB,
                            at most ${MAX_JSON_BODY_BYTES_CEILING}); a JSON body also holds at most
                            ${MAX_JSON_VALUES} values: big tensors belong in safetensors bodies
  --memory-budget-bytes B   total bytes of server-held KV caches (default ${DEFAULT_MEMORY_BUDGET_BYTES} = 4 GiB)
  --max-tokens-per-call N   most query tokens in one forward call (default ${DEFAULT_CALL_LIMITS.max_tokens}); over: 422
  --max-attended-keys N     most attended keys in one forward call: the sum over query tokens of
                            the keys each may see (default ${DEFAULT_CALL_LIMITS.max_attended_keys}); over: 422
  --max-attention-flops N   most attention FLOPs in one forward call: 4 x attended keys x
                            num_heads x head_size (QK^T and PV), counted exactly (default
                            ${DEFAULT_CALL_LIMITS.max_attention_flops} = 2^53 - 1, the largest it takes); over: 422
  --token-file PATH         bearer token (the file's content) required on every route but
                            /healthz; without it the ATTN_TOKEN environment variable is used
  --allow-unauthenticated   serve a non-loopback address without a token (prints a warning)
  --allowed-host NAME       a loopback bind without a token answers only requests whose Host is
                            localhost, 127.0.0.1, [::1] or the --host address (any port), else
                            403; this adds a name or [IPv6] address, without a port (repeatable)
  --shutdown-deadline-ms N  on SIGTERM/SIGINT, wait this long for calls in flight, then exit
                            (default ${DEFAULT_SHUTDOWN_DEADLINE_MS}; 0 to ${MAX_TIMER_MS}, setTimeout's longest);
                            exit code 0 when all finished, 1 when the deadline cut some off
  --body-timeout-ms N       the longest wait for a request body's next bytes (default ${DEFAULT_BODY_TIMEOUT_MS};
                            1 to ${MAX_TIMER_MS}; a body read in one piece must be whole by
                            then plus 1 s per 256 KiB declared; also ${BODY_TIMEOUT_ENV});
                            over: 408 body_timeout
  --no-gpu                  do not acquire a WebGPU device (host backends only)
  --http-engine E           the HTTP server, on this thread or each HTTP worker: deno
                            (Deno.serve; default) or http1 (this service's own HTTP/1.1
                            server on Deno.listen: bounded
                            head and idle times (ATTN_HTTP_HEAD_TIMEOUT_MS,
                            ATTN_HTTP_IDLE_TIMEOUT_MS) and connections
                            (ATTN_HTTP_MAX_CONNECTIONS, the port's, with --http-workers too),
                            problems for malformed requests; no HTTP/2, TLS or
                            --device-threads-http); also
                            ${HTTP_ENGINE_ENV}
  --http-workers N          HTTP worker threads in front of the thread that owns the GPU:
                            they read requests and write answers, this thread validates,
                            plans and runs the calls (default ${DEFAULT_HTTP_WORKERS}; 0 = one thread
                            does it all; also ${HTTP_WORKERS_ENV}; Linux: they share the port)
  --device-threads N        worker threads that each own a WebGPU device of their own and a
                            service over it, this thread doing the HTTP work and sending each
                            call to the thread holding its cache; calls on caches of different
                            threads run side by side (default 0 = this thread owns the device;
                            also ${DEVICE_THREADS_ENV}; not with --http-workers). Each thread
                            gets 1/N of --memory-budget-bytes; keep-warm runs on thread 0
  --device-threads-http     with --device-threads: each device thread also serves the port
                            (Linux: the kernel spreads connections over the threads) and
                            answers the calls on its own caches itself, with no hop through
                            this thread; a cache created on a thread's connection is placed on
                            it when it has room (also ${DEVICE_THREADS_HTTP_ENV}=1)
  --keep-warm-ms N          keep the GPU busy for N ms after each call with short spin
                            dispatches, so its clock stays up between calls (default 0 = off;
                            at most ${MAX_KEEP_WARM_MS}; also ${KEEP_WARM_ENV}); draws power. Needs a
                            runtime whose completion wait does not block (Dawn); elsewhere it
                            stays off and says why
  --keep-warm-spin-iters N  dependent FMA pairs per spin dispatch (default ${KEEP_WARM_DEFAULTS.spin_iters})
  --keep-warm-workgroups N  workgroups of 64 lanes per spin dispatch (default ${KEEP_WARM_DEFAULTS.workgroups})
  --keep-warm-depth N       spin dispatches per tick (timer, process) or kept queued (await),
                            1-8 (default ${KEEP_WARM_DEFAULTS.depth})
  --keep-warm-mode M        timer: spins submitted from a timer, nothing awaited (default);
                            await: a loop awaiting each spin (keeps Dawn's event loop busy);
                            process: the spins in a Deno process of its own, with its own Dawn
                            device (needs --allow-run; the serving thread only signals use)
  --keep-warm-period-ms N   timer, process: ms between ticks, 1-1000 (default ${KEEP_WARM_DEFAULTS.period_ms})
  --instance-name NAME      name this instance in every answer's X-Attention-Instance header
                            and in /healthz (1-64 characters of A-Z a-z 0-9 . _ -; default none)
${RUNTIME_HELP}
  -h, --help                show this help

The GPU layer's and the device threads' ATTN_* variables (README; server/serve_env.ts lists
them: e.g. ATTN_THREAD_PING_MS, ATTN_THREAD_LOST_MS, ATTN_THREAD_EXIT_GRACE_MS) are checked at
start: a bad value exits 2 naming it; empty is the default.
`;
