/**
 * JSON forward bodies decoded off the event loop. Parsing a large JSON body (tens of MiB of
 * numbers) takes the better part of a second, during which nothing else would be answered;
 * bodies of at least {@link JSON_WORKER_MIN_BYTES} are decoded in a worker instead (the bytes
 * transferred in, the decoded tensors transferred back), smaller ones inline where a worker
 * round trip would cost more than it saves. One worker, started on first use, terminated after
 * `idleMs` without work (an idle worker would keep the process alive) and by {@link close}.
 * Errors come back as the same ServiceError (400 `malformed_json`, `json_too_deep`, ...).
 * @module
 */
import { errorFromPlain, type PlainError } from "../core/errors.ts";
import { type DecodedForward, decodeJsonForward } from "../wire/codec.ts";
import { parseJson } from "./body.ts";

/** Bodies from this size on are decoded in the worker. */
export const JSON_WORKER_MIN_BYTES = 1 << 20;

type Reply = { id: number; decoded?: DecodedForward; error?: PlainError };

/** Decodes JSON forward bodies, big ones in a worker. */
export class JsonDecoder {
  readonly idleMs: number;
  #worker: Worker | null = null;
  #pending = new Map<number, { resolve(d: DecodedForward): void; reject(e: unknown): void }>();
  #next = 1;
  #idle: ReturnType<typeof setTimeout> | undefined;
  /** {@link keepWarm}: no idle-out. */
  #warm = false;
  /** The worker has answered something (its `warm` reply, a body's): it loaded and runs. */
  #answered = false;
  #workerDecodes = 0;

  constructor(idleMs = 5_000) {
    this.idleMs = idleMs;
  }

  /** Whether its worker is started. */
  get running(): boolean {
    return this.#worker !== null;
  }

  /** How many bodies the worker has answered (decoded or refused), over every worker started. */
  get workerDecodes(): number {
    return this.#workerDecodes;
  }

  /** The decoded request of a JSON body. */
  decode(bytes: Uint8Array): Promise<DecodedForward> {
    if (bytes.byteLength < JSON_WORKER_MIN_BYTES) {
      return Promise.resolve().then(() => decodeJsonForward(parseJson(bytes)));
    }
    const w = this.#ensure();
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      const own = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength &&
          bytes.buffer instanceof ArrayBuffer
        ? bytes
        : bytes.slice();
      w.postMessage({ id, bytes: own }, { transfer: [own.buffer as ArrayBuffer] });
    });
  }

  /**
   * Starts the worker now and keeps it through idle periods (a device thread, where a worker's
   * first message takes about 500 ms to arrive on Deno 2.9.6, and its start as much again: a
   * first big body there took 1.19 s against 0.07 s after): its first message is sent now.
   */
  keepWarm(): void {
    this.#warm = true;
    this.#ensure().postMessage({ id: 0, warm: true });
  }

  #ensure(): Worker {
    if (this.#idle !== undefined) clearTimeout(this.#idle);
    this.#idle = undefined;
    if (this.#worker) return this.#worker;
    const w = new Worker(new URL("./json_decode_worker.ts", import.meta.url), { type: "module" });
    this.#answered = false;
    w.onmessage = (e: MessageEvent<Reply>) => {
      this.#answered = true;
      this.#settle(e.data);
    };
    w.onerror = (e) => {
      e.preventDefault();
      this.#fail(new Error(`the JSON decoding worker failed: ${e.message}`));
    };
    this.#worker = w;
    return w;
  }

  #settle(r: Reply): void {
    const p = this.#pending.get(r.id);
    if (!p) return;
    this.#pending.delete(r.id);
    this.#workerDecodes++;
    if (r.error) p.reject(errorFromPlain(r.error));
    else p.resolve(r.decoded!);
    if (this.#pending.size === 0 && !this.#warm) {
      const t = setTimeout(() => this.close(), this.idleMs);
      Deno.unrefTimer(t);
      this.#idle = t;
    }
  }

  #fail(e: Error): void {
    this.#worker?.terminate();
    this.#worker = null;
    for (const p of this.#pending.values()) p.reject(e);
    this.#pending.clear();
    // A warm one that failed is replaced, unless it never answered (it cannot load: no loop).
    if (this.#warm && this.#answered) this.keepWarm();
    else this.#warm = false;
  }

  /**
   * Terminates the worker (calls in flight fail); a later big body starts a new one. Undoes
   * {@link keepWarm}.
   */
  close(): void {
    this.#warm = false;
    if (this.#idle !== undefined) clearTimeout(this.#idle);
    this.#idle = undefined;
    if (this.#worker) this.#fail(new Error("the JSON decoder was closed"));
  }
}

/** The process-wide decoder handlers use unless given one (the server closes it on shutdown). */
export const sharedJsonDecoder: JsonDecoder = new JsonDecoder();
