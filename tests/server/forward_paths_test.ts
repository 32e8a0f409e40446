/**
 * The forward answer's `X-Attention-Paths` and `X-Attention-Path-Reasons` over a real port
 * (docs/api.md "Kernel paths"): a backend whose result carries its plan's paths gets both
 * headers, on JSON and safetensors answers of both forward routes; WEBGPU_FLASH on this
 * suite's device (skipped without one) says decode=split_kv for decode rows and, for f32 prefill
 * rows, why they are not on the tensor core; CPU_REFERENCE (a `--no-gpu` server process)
 * sends neither.
 */
import assert from "node:assert/strict";
import type { ForwardBody } from "../../client/client.ts";
import { builtinBackends } from "../../backends/index.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { planPaths } from "../../core/backend_types.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { MANAGER, NO_GPU } from "../support/gpu.ts";
import { rand, startServer } from "./helpers.ts";
import { spawnServer } from "./process.ts";

const HKV = 2, BS = 16;

/** A cache of `n` blocks for head size `d`. */
const cacheSpec = (d: number, dtype: ForwardBody["dtype"], n = 4) => ({
  num_blocks: n,
  block_size: BS,
  num_kv_heads: HKV,
  head_size: d,
  dtype,
});

/** A step of fresh requests (no context) of `lens` tokens, request r in block r. */
function body(lens: number[], d: number, dtype: ForwardBody["dtype"], H = 4): ForwardBody {
  const T = lens.reduce((a, b) => a + b, 0);
  const qsl = [0], slots: number[] = [];
  lens.forEach((n, r) => {
    for (let p = 0; p < n; p++) slots.push(r * BS + p);
    qsl.push(qsl[r] + n);
  });
  return {
    dtype,
    layer: { num_heads: H, num_kv_heads: HKV, head_size: d },
    query: { dtype, shape: [T, H, d], data: rand(T * H * d) },
    key: { dtype, shape: [T, HKV, d], data: rand(T * HKV * d) },
    value: { dtype, shape: [T, HKV, d], data: rand(T * HKV * d) },
    metadata: {
      query_start_loc: qsl,
      seq_lens: lens,
      block_table: lens.map((_, r) => [r]),
      slot_mapping: slots,
    },
  };
}

/** POSTs a forward body as JSON; returns the status and both path headers (body read). */
async function forward(
  url: string,
  b: ForwardBody,
  accept = "application/json",
): Promise<{ status: number; backend: string | null; paths: string | null; why: string | null }> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", accept },
    body: JSON.stringify(b),
  });
  await res.arrayBuffer();
  return {
    status: res.status,
    backend: res.headers.get("x-attention-backend"),
    paths: res.headers.get("x-attention-paths"),
    why: res.headers.get("x-attention-path-reasons"),
  };
}

Deno.test("forward paths: a backend's recorded paths are the answer's headers", async () => {
  const paths = planPaths([
    { part: "decode", path: "split_kv" },
    { part: "prefill", path: "tiles", reason: "dtype not supported (got float32; ...)" },
  ]);
  // CPU_REFERENCE's answers with the paths a plan would have recorded.
  const stub: AttentionBackend = {
    ...(CPU_REFERENCE as AttentionBackend),
    name: "PATHS_STUB",
    run: async (p, b, ctx, o) => {
      const r = await CPU_REFERENCE.run(p as never, b, ctx, o);
      r.paths = paths;
      return r;
    },
  };
  const srv = await startServer({ backends: [stub] });
  try {
    const spec = { num_blocks: 4, block_size: 4, num_kv_heads: HKV, head_size: 8 };
    const res = await fetch(`${srv.url}/v1/kv-caches/p1`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...spec, dtype: "float32" }),
    });
    assert.equal(res.status, 201, await res.text());
    const b = body([1, 3], 8, "float32");
    b.metadata.slot_mapping = [0, 4, 5, 6]; // block_size 4
    for (
      const [url, accept] of [
        [`${srv.url}/v1/attention/forward`, "application/json"],
        [`${srv.url}/v1/kv-caches/p1/forward`, "application/octet-stream"],
      ]
    ) {
      const r = await forward(url, { ...b, kv_cache: "p1" }, accept);
      assert.equal(r.status, 200, url);
      assert.equal(r.backend, "PATHS_STUB");
      assert.equal(r.paths, "decode=split_kv, prefill=tiles");
      assert.equal(r.why, 'prefill="dtype not supported (got float32; ...)"');
    }
  } finally {
    await srv.close();
  }
});

Deno.test({
  name: "forward paths: WEBGPU_FLASH says which kernels ran the decode and prefill rows",
  ignore: NO_GPU,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const srv = await startServer({
      backends: builtinBackends(),
      device: MANAGER,
      memoryBudgetBytes: 2 ** 26,
    });
    const url = `${srv.url}/v1/attention/forward`;
    try {
      for (const dtype of ["float32", "float16"] as const) {
        const id = `paths-${dtype}`;
        const put = await fetch(`${srv.url}/v1/kv-caches/${id}`, {
          method: "PUT",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(cacheSpec(64, dtype)),
        });
        assert.equal(put.status, 201, await put.text());
        // Decode only: the split-KV kernels, nothing to explain.
        const dec = await forward(url, { ...body([1, 1, 1], 64, dtype), kv_cache: id });
        assert.equal(dec.status, 200);
        assert.equal(dec.backend, "WEBGPU_FLASH");
        assert.equal(dec.paths, "decode=split_kv");
        assert.equal(dec.why, null);
        // Mixed, twice (the second from the plan cache) and as safetensors.
        for (const accept of ["application/json", "application/json", "application/octet-stream"]) {
          const mix = await forward(url, { ...body([1, 9, 1], 64, dtype), kv_cache: id }, accept);
          assert.equal(mix.status, 200);
          assert.equal(mix.backend, "WEBGPU_FLASH");
          const m = /^decode=split_kv, prefill=(split_kv|tiles|tensor_core)$/.exec(
            mix.paths ?? "",
          );
          assert.ok(m, `${dtype}: ${mix.paths}`);
          if (m[1] === "tensor_core") {
            assert.equal(dtype, "float16", "f32 data never runs on the tensor core");
            assert.equal(mix.why, null);
            continue;
          }
          // Why not: the adapter (Deno's WebGPU, lavapipe), or the dtype where it has them.
          const noSm = "subgroup matrices not supported \\([ -~]+\\)";
          const f32 = "dtype not supported \\(got float32; supported: float16, bfloat16\\)";
          const env = "tensor-core kernel disabled \\(ATTN_PREFILL_MMA=0\\)";
          const why = dtype === "float32" ? `${env}|${noSm}|${f32}` : `${env}|${noSm}`;
          assert.match(mix.why ?? "", new RegExp(`^prefill="(${why})"$`), dtype);
        }
      }
    } finally {
      await srv.close();
    }
  },
});

Deno.test("forward paths: CPU_REFERENCE (--no-gpu) sends no path headers", async () => {
  const srv = await spawnServer(["--no-gpu"]);
  try {
    const put = await fetch(`${srv.url}/v1/kv-caches/c1`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(cacheSpec(32, "float32")),
    });
    assert.equal(put.status, 201, await put.text());
    const r = await forward(`${srv.url}/v1/attention/forward`, {
      ...body([1, 5], 32, "float32"),
      kv_cache: "c1",
    });
    assert.equal(r.status, 200);
    assert.equal(r.backend, "CPU_REFERENCE");
    assert.equal(r.paths, null);
    assert.equal(r.why, null);
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
  }
});
