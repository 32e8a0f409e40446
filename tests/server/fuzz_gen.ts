/**
 * Hostile requests for the fuzz test, all drawn from one seeded Rng: valid forward, cache and
 * selector bodies mutated structurally (deleted fields, wrong types, huge and fractional
 * numbers, out-of-range and repeated table entries, deep nesting, unknown fields), their JSON
 * text mutated (truncation, bit flips, inserted bytes, number tokens JSON.stringify cannot
 * write), safetensors bodies mutated (bit flips, lying header lengths, edited headers, cut
 * files), lying headers (Content-Type, Content-Length over raw TCP, Accept), and random
 * methods and paths.
 * @module
 */
import { type ForwardBody, forwardBodyToSafetensors } from "../../client/client.ts";
import type { Rng } from "../support/rng.ts";

/** The shapes of the target cache every generated forward body addresses. */
export const TARGET = { H: 4, HKV: 2, D: 8, BS: 4, NB: 8 } as const;

/** One generated request. `raw` requests go over TCP with their own (lying) framing. */
export interface FuzzRequest {
  kind: string;
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: Uint8Array;
  /** Send over raw TCP declaring this Content-Length (a lie), then half-close. */
  lyingLength?: number;
  /** Names the target cache: a rejected call must leave it unchanged. */
  targetsCache: boolean;
}

const enc = (s: string): Uint8Array => new TextEncoder().encode(s);
const pick = <T>(r: Rng, xs: readonly T[]): T => xs[r.int(xs.length)];

/** A valid decode/prefill body on the target cache (or inline / no cache). */
export function validForward(r: Rng, kvCache: string | undefined): ForwardBody {
  const { H, HKV, D, BS, NB } = TARGET;
  const reqs = 1 + r.int(2);
  const lens = Array.from({ length: reqs }, () => 1 + r.int(3));
  const T = lens.reduce((a, b) => a + b, 0);
  const vals = (n: number) => Array.from({ length: n }, () => Math.fround(r.uniform(-1, 1)));
  const ids = r.shuffle(Array.from({ length: NB }, (_, i) => i));
  const table = lens.map((_, i) => [ids[2 * i], ids[2 * i + 1]]);
  const seq = lens.map((n) => n + r.int(2 * BS - n + 1));
  const slots: number[] = [];
  lens.forEach((n, i) => {
    for (let j = 0; j < n; j++) {
      const p = seq[i] - n + j;
      slots.push(table[i][Math.floor(p / BS)] * BS + (p % BS));
    }
  });
  const qsl = [0];
  for (const n of lens) qsl.push(qsl[qsl.length - 1] + n);
  const b64 = r.next() < 0.3;
  const t = (h: number) => {
    const data = vals(T * h * D);
    return b64
      ? {
        dtype: "float32",
        shape: [T, h, D],
        base64: new Uint8Array(Float32Array.from(data).buffer).toBase64(),
      }
      : { dtype: "float32", shape: [T, h, D], data };
  };
  return {
    dtype: "float32",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: t(H),
    key: t(HKV),
    value: t(HKV),
    metadata: { query_start_loc: qsl, seq_lens: seq, block_table: table, slot_mapping: slots },
    kv_cache: kvCache,
    return_lse: r.next() < 0.5,
  };
}

function validCreate(r: Rng): Record<string, unknown> {
  return {
    num_blocks: 1 + r.int(4),
    block_size: pick(r, [4, 8, 16]),
    num_kv_heads: 1 + r.int(2),
    head_size: pick(r, [8, 16, 64]),
    dtype: pick(r, ["float32", "float16", "bfloat16"]),
    kv_cache_dtype: pick(r, ["auto", "float16", "fp8_e4m3"]),
  };
}

function validSelect(r: Rng): Record<string, unknown> {
  return {
    head_size: pick(r, [64, 128, 72]),
    dtype: pick(r, ["float16", "float32"]),
    block_size: pick(r, [16, 32]),
    has_sink: r.next() < 0.5,
    backend: pick(r, [undefined, "auto", "CPU_REFERENCE", "WEBGPU_FLASH", "NOPE"]),
  };
}

const deep = (n: number) => "[".repeat(n) + "]".repeat(n);

/** Hostile values; strings starting with "\u0001" are raw JSON text spliced in as is. */
function hostileValue(r: Rng): unknown {
  const raw = (s: string) => "\u0001" + s;
  return pick(r, [
    () => null,
    () => true,
    () => "",
    () => "x".repeat(1 + r.int(5000)),
    () => -1,
    () => 0,
    () => 1.5,
    () => 2 ** 31,
    () => 2 ** 31 - 1,
    () => -(2 ** 31) - 1,
    () => 2 ** 53 + 2,
    () => 1e308,
    () => -1e-320,
    () => raw("1e999"),
    () => raw("-1e999"),
    () => raw("123456789012345678901234567890"),
    () => raw("-0"),
    () => raw(deep(5 + r.int(60))),
    () => raw(deep(2000)),
    () => [],
    () => ({}),
    () => [[[1]]],
    () => Array.from({ length: 1 + r.int(3000) }, () => r.int(2e9) - 1e9),
    () => ({ dtype: "int64", shape: [1], base64: "////////f/8=" }),
    () => ({ dtype: "float32", shape: [2 ** 31 - 1, 2 ** 31 - 1], data: [1] }),
    () => "\u0000\ud800",
    () => r.int(100) - 50,
  ])();
}

type Json = Record<string, unknown> | unknown[];

function paths(v: unknown, prefix: (string | number)[] = [], out: (string | number)[][] = []) {
  if (v === null || typeof v !== "object" || out.length > 400) return out;
  const entries = Array.isArray(v) ? v.map((x, i) => [i, x] as const) : Object.entries(v);
  for (const [k, x] of entries.slice(0, 40)) {
    out.push([...prefix, k]);
    paths(x, [...prefix, k], out);
  }
  return out;
}

/** Applies 1-3 structural mutations in place. */
function mutateStructure(r: Rng, body: Json): void {
  for (let m = 1 + r.int(3); m > 0; m--) {
    const all = paths(body);
    if (all.length === 0) return;
    const path = pick(r, all);
    let parent: Record<string | number, unknown> = body as Record<string, unknown>;
    for (const k of path.slice(0, -1)) parent = parent[k] as Record<string | number, unknown>;
    const key = path[path.length - 1];
    const op = r.int(10);
    if (op === 0 && !Array.isArray(parent)) delete parent[key];
    else if (op === 1) parent[`unknown_${r.int(5)}`] = hostileValue(r);
    else if (op === 2 && typeof parent[key] === "number") {
      parent[key] = pick(r, [TARGET.NB, TARGET.NB * TARGET.BS, -1, -2, 2 ** 31 - 1, 0, 1]);
    } else parent[key] = hostileValue(r);
  }
}

/** Puts out-of-range, negative, repeated or huge entries into the batch metadata tables. */
function mutateTables(r: Rng, fwd: ForwardBody): void {
  const md = fwd.metadata as Record<string, number[] | number[][]>;
  const { NB, BS } = TARGET;
  for (let m = 1 + r.int(2); m > 0; m--) {
    const name = pick(r, ["query_start_loc", "seq_lens", "block_table", "slot_mapping"]);
    const t = md[name];
    const row = (Array.isArray(t[0]) ? pick(r, t as number[][]) : t) as number[];
    const i = r.int(row.length);
    row[i] = pick(r, [
      NB,
      NB * BS,
      -1,
      -2,
      2 ** 31 - 1,
      row[(i + 1) % row.length],
      row[i] + 1,
      row[i] - 1,
      0,
      1e6,
    ]);
  }
}

/** JSON text, splicing raw values (marked "\u0001...") in as they are. */
function toText(body: unknown): string {
  return JSON.stringify(body).replace(
    /"\\u0001((?:[^"\\]|\\.)*)"/g,
    (_, s) => JSON.parse(`"${s}"`),
  );
}

function mutateBytes(r: Rng, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(b);
  switch (r.int(5)) {
    case 0: // bit flips
      for (let n = 1 + r.int(8); n > 0; n--) out[r.int(out.length)] ^= 1 << r.int(8);
      return out;
    case 1: // truncation
      return out.subarray(0, r.int(out.length));
    case 2: { // inserted bytes
      const at = r.int(out.length + 1),
        ins = Uint8Array.from({ length: 1 + r.int(8) }, () => r.int(256));
      const o = new Uint8Array(out.length + ins.length);
      o.set(out.subarray(0, at));
      o.set(ins, at);
      o.set(out.subarray(at), at + ins.length);
      return o;
    }
    case 3: // a range deleted
    {
      const a = r.int(out.length), n = 1 + r.int(32);
      return Uint8Array.from([...out.subarray(0, a), ...out.subarray(a + n)]);
    }
    default: // bytes set to a structural character
      for (let n = 1 + r.int(4); n > 0; n--) {
        out[r.int(out.length)] = pick(r, [0x22, 0x5c, 0x5b, 0x7b, 0x2c, 0x00, 0xff]);
      }
      return out;
  }
}

function safetensorsMutation(r: Rng, file: Uint8Array): Uint8Array {
  const out = new Uint8Array(file);
  const dv = new DataView(out.buffer);
  const hl = Number(dv.getBigUint64(0, true));
  switch (r.int(4)) {
    case 0: // header length lies
      dv.setBigUint64(
        0,
        pick(r, [
          0n,
          1n,
          BigInt(hl - 1),
          BigInt(hl + 1),
          2n ** 63n,
          2n ** 64n - 1n,
          100n * 2n ** 20n,
        ]),
        true,
      );
      return out;
    case 1: { // the header JSON mutated structurally
      let header: Json;
      try {
        header = JSON.parse(new TextDecoder().decode(out.subarray(8, 8 + hl)));
      } catch {
        return mutateBytes(r, out); // not a safetensors file (the client could not encode it)
      }
      mutateStructure(r, header);
      const h = enc(toText(header));
      const o = new Uint8Array(8 + h.length + out.length - 8 - hl);
      new DataView(o.buffer).setBigUint64(0, BigInt(h.length), true);
      o.set(h, 8);
      o.set(out.subarray(8 + hl), 8 + h.length);
      return o;
    }
    default:
      return mutateBytes(r, out);
  }
}

const JSON_CT = ["application/json", "application/json; charset=utf-8", "application/problem+json"];
const LIES_CT = [
  "text/plain",
  "application/octet-stream",
  "",
  "application/x-www-form-urlencoded",
  "multipart/form-data; boundary=x",
];

/** One hostile request. `target` is the id of the cache forward bodies address. */
export function hostileRequest(r: Rng, target: string): FuzzRequest {
  const route = r.int(10);
  const headers: Record<string, string> = {};
  if (route < 6) { // forward: JSON or safetensors, mutated
    const fwd = validForward(r, pick(r, [target, target, target, undefined, "nope", ""]));
    const targetsCache = fwd.kv_cache === target;
    if (r.next() < 0.3) {
      const x = r.next();
      if (x < 0.3) mutateTables(r, fwd);
      else if (x < 0.6) mutateStructure(r, fwd as unknown as Json);
      let file: Uint8Array;
      try {
        file = forwardBodyToSafetensors(fwd);
      } catch {
        file = enc(toText(fwd)); // the client could not encode it: send the JSON as octets
      }
      headers["content-type"] = r.next() < 0.9 ? "application/octet-stream" : pick(r, JSON_CT);
      if (r.next() < 0.5) {
        headers.accept = pick(r, [
          "application/octet-stream",
          "*/*",
          "application/octet-stream;q=0",
        ]);
      }
      const body = r.next() < 0.8 ? safetensorsMutation(r, file) : file;
      return withLies(r, {
        kind: "forward-safetensors",
        method: "POST",
        path: "/v1/attention/forward",
        headers,
        body,
        targetsCache,
      });
    }
    if (r.next() < 0.3) mutateTables(r, fwd);
    else mutateStructure(r, fwd as unknown as Json);
    let body = enc(toText(fwd));
    if (r.next() < 0.4) body = mutateBytes(r, body);
    headers["content-type"] = r.next() < 0.9 ? pick(r, JSON_CT) : pick(r, LIES_CT);
    return withLies(r, {
      kind: "forward-json",
      method: "POST",
      path: "/v1/attention/forward",
      headers,
      body,
      targetsCache,
    });
  }
  if (route < 8) { // create or select
    const create = route === 6;
    const obj = create ? validCreate(r) : validSelect(r);
    mutateStructure(r, obj);
    let body = enc(toText(obj));
    if (r.next() < 0.3) body = mutateBytes(r, body);
    headers["content-type"] = r.next() < 0.9 ? "application/json" : pick(r, LIES_CT);
    const path = create ? "/v1/kv-caches" : "/v1/backends/select";
    return withLies(r, {
      kind: create ? "create" : "select",
      method: "POST",
      path,
      headers,
      body,
      targetsCache: false,
    });
  }
  // Random methods and paths (never DELETE the target or a witness: ids are random).
  const method = pick(r, [
    "GET",
    "HEAD",
    "DELETE",
    "PUT",
    "PATCH",
    "OPTIONS",
    "FUZZ",
    `X${r.int(1e6)}`,
  ]);
  const uuidish = [8, 4, 4, 4, 12].map((n) =>
    r.u32().toString(16).padStart(8, "0").repeat(2).slice(0, n)
  );
  const id = pick(r, [
    uuidish.join("-"),
    "nope",
    "%00",
    "..%2F..%2Fetc",
    "x".repeat(2000),
    `${r.int(1e9)}`,
  ]);
  const path = pick(r, [
    "/healthz",
    "/metrics",
    "/v1/device",
    "/v1/backends",
    `/v1/kv-caches/${id}`,
    `/v1/kv-caches/${id}/data`,
    "/v1/kv-caches/",
    "/v1/attention/forward",
    "/v1/../v1/backends",
    `/${"a/".repeat(r.int(200))}`,
    "/openapi.json?x=" + "%".repeat(r.int(10)),
  ]);
  const body = method === "GET" || method === "HEAD"
    ? undefined
    : enc(toText(hostileValue(r) ?? null));
  if (body) headers["content-type"] = pick(r, [...JSON_CT, ...LIES_CT]);
  return { kind: "other", method, path, headers, body, targetsCache: false };
}

/** Sometimes: a Content-Length that lies (longer than the body), or a Content-Encoding claim. */
function withLies(r: Rng, q: FuzzRequest): FuzzRequest {
  const x = r.next();
  if (x < 0.05 && q.body && q.body.length > 0) {
    return { ...q, lyingLength: q.body.length + 1 + r.int(1000) };
  }
  if (x < 0.08) q.headers["content-encoding"] = pick(r, ["gzip", "br", "identity"]);
  return q;
}
