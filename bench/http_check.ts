/**
 * End-to-end check for a real GPU, over HTTP on a real port: a server-held GPU cache of about
 * 1 GiB (or `--gib N`), a prefill then a decode step whose blocks sit anywhere in it (the last
 * block included), each compared with CPU_REFERENCE run on a host cache fed the same calls.
 * Prints one line per step and exits 1 on a mismatch. Run: `deno run -A bench/http_check.ts
 * [--runtime deno|dawn|auto]` (default: ATTN_WEBGPU_RUNTIME, else deno).
 * @module
 */
import { parseArgs } from "node:util";
import { AttentionService, builtinBackends, createHandler } from "../mod.ts";
import { acquireSelected } from "../gpu/device.ts";
import { resolveRuntimeOptions, runtimeEnv } from "../gpu/runtime_options.ts";
import { AttentionClient, type ForwardBody } from "../client/client.ts";
import { allclose } from "../tests/support/compare.ts";

const { values: args } = parseArgs({
  options: { gib: { type: "string", default: "1" }, runtime: { type: "string" } },
});
const gib = Number(args.gib);
const [bs, kvh, hs, heads] = [16, 8, 128, 32];
const blockBytes = 2 * bs * kvh * hs * 2; // K+V, f16
const numBlocks = Math.floor(gib * 2 ** 30 / blockBytes);

const { manager: device, ctx: gpu } = await acquireSelected(
  resolveRuntimeOptions({ runtime: args.runtime }, runtimeEnv(), "--runtime"),
);
if (!gpu) {
  console.log(`no WebGPU adapter (${device.report().reason}): nothing to check`);
  Deno.exit(0);
}
console.log(`adapter: ${gpu.adapter_info.description || gpu.adapter_info.vendor}`);
const service = new AttentionService({
  backends: builtinBackends(),
  device,
  memoryBudgetBytes: 2 * 2 * gib * 2 ** 30 + 2 ** 30,
});
const server = Deno.serve(
  { port: 0, hostname: "127.0.0.1", onListen() {} },
  createHandler(service),
);
const client = new AttentionClient(`http://127.0.0.1:${server.addr.port}`);
let failed = 0;
try {
  const spec = { num_blocks: numBlocks, block_size: bs, num_kv_heads: kvh, head_size: hs };
  const gpuCache = await client.createCache({ ...spec, dtype: "float16", kv_cache_dtype: "auto" });
  const hostCache = await client.createCache({
    ...spec,
    dtype: "float16",
    kv_cache_dtype: "auto",
    backend: "CPU_REFERENCE",
  });
  console.log(
    `caches: ${gpuCache.storage} ${gpuCache.bytes} bytes (${gpuCache.backend}), ` +
      `${hostCache.storage} ${hostCache.bytes} bytes`,
  );
  const reqs = 4, prompt = 64, maxBlocks = 8;
  // Distinct blocks spread over the whole cache, the last one first.
  const picked = new Set<number>([numBlocks - 1]);
  while (picked.size < reqs * maxBlocks) {
    picked.add(1 + Math.floor(Math.random() * (numBlocks - 2)));
  }
  const ids = [...picked];
  const table = Array.from(
    { length: reqs },
    (_, r) => ids.slice(r * maxBlocks, (r + 1) * maxBlocks),
  );
  const rand = (n: number) => Array.from({ length: n }, () => Math.random() * 2 - 1);
  const step = (qlen: number, ctx: number): Omit<ForwardBody, "kv_cache"> => {
    const T = reqs * qlen;
    const slots: number[] = [];
    for (let r = 0; r < reqs; r++) {
      for (let j = 0; j < qlen; j++) {
        const pos = ctx - qlen + j;
        slots.push(table[r][Math.floor(pos / bs)] * bs + (pos % bs));
      }
    }
    return {
      dtype: "float16",
      layer: { num_heads: heads, num_kv_heads: kvh, head_size: hs },
      query: { dtype: "float16", shape: [T, heads, hs], data: rand(T * heads * hs) },
      key: { dtype: "float16", shape: [T, kvh, hs], data: rand(T * kvh * hs) },
      value: { dtype: "float16", shape: [T, kvh, hs], data: rand(T * kvh * hs) },
      metadata: {
        query_start_loc: Array.from({ length: reqs + 1 }, (_, r) => r * qlen),
        seq_lens: Array(reqs).fill(ctx),
        block_table: table,
        slot_mapping: slots,
      },
      return_lse: true,
    };
  };
  for (
    const [name, body] of [["prefill 4x64", step(prompt, prompt)], [
      "decode 4x65",
      step(1, prompt + 1),
    ]] as const
  ) {
    const got = await client.forward({ ...body, kv_cache: gpuCache.id });
    const ref = await client.forward({ ...body, kv_cache: hostCache.id, backend: "CPU_REFERENCE" });
    const o = allclose(got.output.values, ref.output.values, { atol: 1e-2, rtol: 1e-2 });
    const l = allclose(got.lse!.values, ref.lse!.values, { atol: 1e-2, rtol: 1e-2 });
    const ok = o.ok && l.ok;
    if (!ok) failed++;
    console.log(
      `${
        ok ? "ok  " : "FAIL"
      } ${name}: ${got.backend} vs ${ref.backend}; output ${o.message}; lse ${l.message}`,
    );
  }
  await client.deleteCache(gpuCache.id);
  await client.deleteCache(hostCache.id);
} finally {
  await server.shutdown();
}
Deno.exit(failed ? 1 : 0);
