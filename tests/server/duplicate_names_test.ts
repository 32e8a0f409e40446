/**
 * A JSON object that names a member twice is refused wherever the service parses JSON: a
 * safetensors header (forward bodies, cache imports), `__metadata__.request`, a JSON body.
 * JSON.parse keeps the last of them, so before this a first `slot_mapping` entry of dtype
 * "BOGUS" (alone a 400) was dropped and the call ran on the second, writing the cache (session
 * 38's HTTP audit). Each refusal leaves the cache's bytes as they were.
 */
import { REPEATED_NAME } from "../../core/json_structure.ts";
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { forwardBodyToSafetensors } from "../../wire/client_codec.ts";
import { handSafetensors } from "../support/hand_safetensors.ts";
import { rand, startServer, type TestServer } from "./helpers.ts";

const H = 2, HKV = 1, D = 4;
const SPEC = {
  num_blocks: 4,
  block_size: 16,
  num_kv_heads: HKV,
  head_size: D,
  dtype: "float32",
} as const;

function body(): ForwardBody {
  return {
    dtype: "float32",
    kv_cache: "c",
    layer: { num_heads: H, num_kv_heads: HKV, head_size: D },
    query: { dtype: "float32", shape: [2, H, D], data: rand(2 * H * D) },
    key: { dtype: "float32", shape: [2, HKV, D], data: rand(2 * HKV * D) },
    value: { dtype: "float32", shape: [2, HKV, D], data: rand(2 * HKV * D) },
    metadata: {
      query_start_loc: [0, 1, 2],
      seq_lens: [1, 1],
      block_table: [[0], [1]],
      slot_mapping: [0, 16],
    },
  } as ForwardBody;
}

/** A safetensors file's header text and data section. */
function split(file: Uint8Array): { header: string; data: Uint8Array } {
  const n = Number(new DataView(file.buffer, file.byteOffset).getBigUint64(0, true));
  return {
    header: new TextDecoder().decode(file.subarray(8, 8 + n)),
    data: file.subarray(8 + n),
  };
}

/** The file with `members` (JSON text, comma-separated) put first in its header object. */
function withFirst(file: Uint8Array, members: string): Uint8Array {
  const { header, data } = split(file);
  return handSafetensors(`{${members},${header.slice(1)}`, data);
}

async function send(srv: TestServer, method: string, path: string, b: Uint8Array | string) {
  const json = typeof b === "string";
  const res = await fetch(`${srv.url}${path}`, {
    method,
    headers: {
      "content-type": json ? "application/json" : "application/octet-stream",
      accept: "application/json",
    },
    body: b as BodyInit,
  });
  return { status: res.status, doc: await res.json() };
}

async function cacheBytes(srv: TestServer): Promise<Uint8Array> {
  const res = await fetch(`${srv.url}/v1/kv-caches/c/data`);
  assert.equal(res.status, 200);
  return new Uint8Array(await res.arrayBuffer());
}

Deno.test("duplicate names: refused in headers, requests and JSON bodies; the cache unchanged", async () => {
  const srv = await startServer();
  try {
    await srv.client.putCache("c", SPEC);
    const before = await cacheBytes(srv);
    const file = forwardBodyToSafetensors(body());
    const { header, data } = split(file);
    const request = JSON.parse(header).__metadata__.request as string;
    const meta = JSON.stringify(JSON.parse(header).__metadata__);
    const cases: [string, string, string, Uint8Array | string, number, string, unknown[]][] = [
      [
        "a bad first slot_mapping entry",
        "POST",
        "/v1/attention/forward",
        withFirst(file, '"slot_mapping":{"dtype":"BOGUS","shape":"x","data_offsets":7}'),
        400,
        "bad_safetensors",
        ["slot_mapping"],
      ],
      [
        "__metadata__ twice",
        "POST",
        "/v1/attention/forward",
        withFirst(file, '"__metadata__":5'),
        400,
        "bad_safetensors",
        ["__metadata__"],
      ],
      [
        "request twice in __metadata__",
        "POST",
        "/v1/attention/forward",
        handSafetensors(
          header.replace(meta, `{"request":${JSON.stringify('{"a":1}')},${meta.slice(1)}`),
          data,
        ),
        400,
        "bad_safetensors",
        ["__metadata__", "request"],
      ],
      [
        "a name twice in a tensor's entry",
        "POST",
        "/v1/attention/forward",
        handSafetensors(header.replace('"dtype":"F32"', '"dtype":"F16","dtype":"F32"'), data),
        400,
        "bad_safetensors",
        ["query", "dtype"],
      ],
      [
        "dtype twice in __metadata__.request",
        "POST",
        "/v1/attention/forward",
        handSafetensors(
          header.replace(
            JSON.stringify(request),
            JSON.stringify(`{"dtype":"bfloat16",${request.slice(1)}`),
          ),
          data,
        ),
        400,
        "invalid_request",
        ["__metadata__", "request", "dtype"],
      ],
      [
        "layer twice in a JSON body",
        "POST",
        "/v1/attention/forward",
        `{"layer":{"num_heads":99},${JSON.stringify(body()).slice(1)}`,
        400,
        "malformed_json",
        ["layer"],
      ],
      [
        "key_cache twice in a cache import",
        "PUT",
        "/v1/kv-caches/c/data",
        withFirst(before, '"key_cache":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'),
        400,
        "bad_safetensors",
        ["key_cache"],
      ],
    ];
    for (const [what, method, path, b, status, code, at] of cases) {
      const r = await send(srv, method, path, b);
      assert.equal(r.status, status, `${what}: ${JSON.stringify(r.doc)}`);
      assert.equal(r.doc.code, code, what);
      // One message wherever the JSON was (three wordings before, one of them without the why).
      assert.ok(
        (r.doc.issues ?? []).some((i: { path: unknown[]; message: string }) =>
          JSON.stringify(i.path) === JSON.stringify(at) && i.message === REPEATED_NAME
        ),
        `${what}: no issue at ${JSON.stringify(at)} saying why: ${JSON.stringify(r.doc)}`,
      );
      assert.match(r.doc.detail, /twice/, what);
      assert.deepEqual(await cacheBytes(srv), before, `${what}: the cache changed`);
    }
    // The same bodies without the repeat are served (the cache then changes).
    assert.equal((await send(srv, "POST", "/v1/attention/forward", file)).status, 200);
    assert.equal((await send(srv, "PUT", "/v1/kv-caches/c/data", before)).status, 200);
  } finally {
    await srv.close();
  }
});
