/**
 * The calls of bench/http_overhead.ts: bodies of a workload (issue 7's decode step, the small
 * shape's decode step, or a 4 x 2048 prefill call), prepared for a caller, and one call timed
 * from the send to the parsed answer, split into the send (until the answer's last byte) and
 * the parse.
 * @module
 */
import { parseSafetensors } from "../core/safetensors.ts";
import { decodeBody, prefillBody } from "./http_bodies.ts";
import { type Caller, caller, type ClientKind, type Prepared } from "./http_client.ts";
import {
  BIG_SHAPE,
  chunkQuery,
  chunksOf,
  type HttpShape,
  layoutOf,
  SMALL_SHAPE,
  stepData,
} from "./http_workload.ts";

/** What the calls carry. */
export type Workload = "decode" | "small" | "prefill";

/** The workloads, for the command line. */
export const WORKLOADS: readonly Workload[] = ["decode", "small", "prefill"];

/** `n` distinct decode-step bodies, or `n` times one prefill body. */
export function bodies(n: number, w: Workload): Uint8Array[] {
  const s: HttpShape = w === "small" ? SMALL_SHAPE : BIG_SHAPE, layout = layoutOf(s, 1);
  if (w === "prefill") {
    const c = chunksOf(s)[0], row = s.num_kv_heads * s.head_size;
    const ctx = Array.from({ length: s.reqs }, () => new Uint16Array(s.ctx * row).fill(0x3c00));
    const b = prefillBody(s, layout, "c0", c, chunkQuery(s, 1, c), ctx, ctx);
    return Array.from({ length: n }, () => b);
  }
  return Array.from({ length: n }, (_, i) => decodeBody(s, layout, "c0", i, stepData(s, 1, 0, i)));
}

/** A caller of `kind` and `n` requests of workload `w`, prepared for it. */
export function requests(
  kind: ClientKind,
  url: string,
  n: number,
  w: Workload,
): { c: Caller; rs: Prepared[] } {
  const c = caller(kind, url, {}, { reuseAnswers: true }); // call() keeps no answer
  return { c, rs: bodies(n, w).map((b) => c.prepare(b)) };
}

/** One call's milliseconds. */
export interface Split {
  total: number;
  /** Send to the answer's last byte. */
  send: number;
  /** Parsing the safetensors answer. */
  parse: number;
}

/** One call, timed and split. */
export async function call(c: Caller, request: Prepared): Promise<Split> {
  const t0 = performance.now();
  const { status, body } = await c.send(request);
  const t1 = performance.now();
  if (status !== 200) throw new Error(`HTTP ${status}: ${new TextDecoder().decode(body)}`);
  parseSafetensors(body);
  const t2 = performance.now();
  return { total: t2 - t0, send: t1 - t0, parse: t2 - t1 };
}
