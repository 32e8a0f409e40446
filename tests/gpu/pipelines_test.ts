import assert from "node:assert/strict";
import { ShaderCompileError } from "../../core/errors.ts";
import {
  cachedPipelineKeys,
  compilePipeline,
  compileTimeoutMs,
  getComputePipeline,
} from "../../gpu/pipelines.ts";
import type { GpuContext } from "../../core/types.ts";
import { gpu, NO_GPU } from "./helpers.ts";
import { withEnv } from "../support/env.ts";

const GOOD = `@group(0) @binding(0) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(4) fn main(@builtin(global_invocation_id) g: vec3<u32>) { o[g.x] = g.x * 3u; }`;

Deno.test("pipelines: compiles once per key and runs", { ignore: NO_GPU }, async () => {
  const ctx = gpu();
  const key = `test.good:${crypto.randomUUID()}`;
  const [p, q] = await Promise.all([
    getComputePipeline(ctx, key, GOOD),
    getComputePipeline(ctx, key, GOOD),
  ]);
  assert.equal(p, q);
  assert.ok(cachedPipelineKeys(ctx).includes(key));
  const buf = ctx.device.createBuffer({
    size: 32,
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
  });
  const rd = ctx.device.createBuffer({
    size: 32,
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const enc = ctx.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(p);
  pass.setBindGroup(
    0,
    ctx.device.createBindGroup({
      layout: p.getBindGroupLayout(0),
      entries: [{ binding: 0, resource: { buffer: buf } }],
    }),
  );
  pass.dispatchWorkgroups(2);
  pass.end();
  enc.copyBufferToBuffer(buf, 0, rd, 0, 32);
  ctx.device.queue.submit([enc.finish()]);
  await rd.mapAsync(GPUMapMode.READ);
  assert.deepEqual([...new Uint32Array(rd.getMappedRange())], [0, 3, 6, 9, 12, 15, 18, 21]);
  rd.unmap();
  buf.destroy();
  rd.destroy();
  await assert.rejects(
    () => getComputePipeline(ctx, key, GOOD + "\n"),
    /reused for different WGSL/,
  );
});

Deno.test("pipelines: bad WGSL throws ShaderCompileError with the compiler's messages", {
  ignore: NO_GPU,
}, async () => {
  const ctx = gpu();
  const key = `test.bad:${crypto.randomUUID()}`;
  const bad = "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }";
  const err = await getComputePipeline(ctx, key, bad).then(() => null, (e) => e);
  assert.ok(err instanceof ShaderCompileError, `got ${err}`);
  assert.equal(err.key, key);
  assert.equal(err.status, 500);
  assert.equal(err.code, "shader_compile_failed");
  assert.ok(err.messages.some((m: string) => /u32/.test(m)), err.messages.join("\n"));
  assert.ok(!cachedPipelineKeys(ctx).includes(key), "failures are not cached");
  // A wrong entry point is a pipeline (not parse) failure.
  const e2 = await getComputePipeline(ctx, `${key}.ep`, GOOD, "nope").then(() => null, (e) => e);
  assert.ok(e2 instanceof ShaderCompileError, `got ${e2}`);
  assert.ok(e2.messages.length > 0);
  // The device is still usable afterwards.
  assert.ok(await getComputePipeline(ctx, `${key}.ok`, GOOD));
});

Deno.test("a driver compile that never finishes fails the call after ATTN_COMPILE_TIMEOUT_MS", async () => {
  // A stub device: the shader parses, the pipeline never comes, and the error scopes never
  // resolve either (as when the device is stuck in the compile): nothing may wait on them.
  const never = new Promise<never>(() => {});
  const device = {
    pushErrorScope() {},
    popErrorScope: () => never,
    createShaderModule: () => ({ getCompilationInfo: () => Promise.resolve({ messages: [] }) }),
    createPipelineLayout: () => ({}),
    createComputePipelineAsync: () => never,
  } as unknown as GPUDevice;
  const ctx = { device } as unknown as GpuContext;
  await withEnv({ ATTN_COMPILE_TIMEOUT_MS: "50" }, async () => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const hung = new Promise((r) => timer = setTimeout(() => r("still waiting after 3 s"), 3000));
    const outcome = await Promise.race([
      compilePipeline(ctx, "stuck(k=1)", "@compute @workgroup_size(1) fn main() {}", "auto")
        .then(() => "compiled", (e) => e),
      hung,
    ]);
    clearTimeout(timer);
    assert.ok(outcome instanceof ShaderCompileError, String(outcome));
    assert.equal(outcome.key, "stuck(k=1)");
    assert.match(
      outcome.message,
      /did not finish compiling it within 50 ms \(waiting for its pipeline\)/,
    );
  });
});

/** A stub device whose pieces resolve as `parts` say (default: at once, no messages). */
function stubContext(parts: {
  info?: () => Promise<unknown>;
  pipeline?: () => Promise<unknown>;
  pop?: () => Promise<unknown>;
}): GpuContext {
  const device = {
    pushErrorScope() {},
    popErrorScope: parts.pop ?? (() => Promise.resolve(null)),
    createShaderModule: () => ({
      getCompilationInfo: parts.info ?? (() => Promise.resolve({ messages: [] })),
    }),
    createPipelineLayout: () => ({}),
    createComputePipelineAsync: parts.pipeline ?? (() => Promise.resolve({})),
  } as unknown as GPUDevice;
  return { device } as unknown as GpuContext;
}

const NEVER = () => new Promise<never>(() => {});
const TRIVIAL = "@compute @workgroup_size(1) fn main() {}";

Deno.test("a compile stalled in its compilation info or its error scopes fails, naming where", async () => {
  await withEnv({ ATTN_COMPILE_TIMEOUT_MS: "40" }, async () => {
    for (
      const [parts, stage] of [
        [{ info: NEVER }, "compilation info"],
        [{ pop: NEVER }, "validation error scope"],
      ] as const
    ) {
      const err = await compilePipeline(stubContext(parts), "stall(k=2)", TRIVIAL, "auto")
        .then(() => null, (e) => e);
      assert.ok(err instanceof ShaderCompileError, `${stage}: got ${err}`);
      assert.match(err.message, new RegExp(`within 40 ms \\(waiting for its ${stage}\\)`));
    }
  });
});

Deno.test("a compile's bound is read once, as it starts: a later change does not reach it", async () => {
  // The timeout's message read the variable again when the timer fired: it named the new
  // value (600000 ms for "abc"), and with the rule strict a bad one would throw in the timer.
  await withEnv({ ATTN_COMPILE_TIMEOUT_MS: "40" }, async () => {
    const err = compilePipeline(stubContext({ pipeline: NEVER }), "late(k=3)", TRIVIAL, "auto")
      .then(() => null, (e) => e);
    Deno.env.set("ATTN_COMPILE_TIMEOUT_MS", "abc");
    const e = await err;
    assert.ok(e instanceof ShaderCompileError, String(e));
    assert.match(e.message, /within 40 ms \(waiting for its pipeline\)/);
    assert.throws(() => compileTimeoutMs(), /ATTN_COMPILE_TIMEOUT_MS must be an integer/);
  });
});

Deno.test("ATTN_COMPILE_SERIAL=1 runs one compile at a time per device", async () => {
  let running = 0;
  let most = 0;
  const order: number[] = [];
  let n = 0;
  const ctx = stubContext({
    pipeline: async () => {
      const me = n++;
      running++;
      most = Math.max(most, running);
      await new Promise((r) => setTimeout(r, 5 * (3 - me)));
      order.push(me);
      running--;
      return {};
    },
  });
  const compileAll = () =>
    Promise.all([0, 1, 2].map((i) => compilePipeline(ctx, `serial(k=${i})`, TRIVIAL, "auto")));
  await withEnv({ ATTN_COMPILE_SERIAL: "1" }, compileAll);
  assert.equal(most, 1);
  assert.deepEqual(order, [0, 1, 2]);
  // Without it they overlap (the shortest finishes first).
  most = 0;
  n = 0;
  order.length = 0;
  await withEnv({ ATTN_COMPILE_SERIAL: "0" }, compileAll);
  assert.equal(most, 3);
  assert.deepEqual(order, [2, 1, 0]);
});

/**
 * A stub device with a real error-scope stack: a shader whose code says BAD reports a validation
 * error to the innermost validation scope when its module is created, as WebGPU does.
 */
function scopedStub(): GpuContext {
  const stack: { filter: string; error: GPUError | null }[] = [];
  const later = <T>(v: T) => new Promise<T>((r) => setTimeout(() => r(v), 5));
  const device = {
    pushErrorScope(filter: string) {
      stack.push({ filter, error: null });
    },
    popErrorScope: () => Promise.resolve(stack.pop()!.error),
    createShaderModule({ code }: { code: string }) {
      if (code.includes("BAD")) {
        const scope = stack.findLast((s) => s.filter === "validation");
        if (scope && !scope.error) scope.error = { message: "bad shader" } as GPUError;
      }
      return { getCompilationInfo: () => later({ messages: [] }) };
    },
    createPipelineLayout: () => ({}),
    createComputePipelineAsync: () => later({}),
  } as unknown as GPUDevice;
  return { device } as unknown as GpuContext;
}

Deno.test("two overlapping compiles each get their own error scopes' errors", async () => {
  // Before, a compile held its scopes across its awaits: the one that finished first popped the
  // other's, so the bad shader's error reached the good one (failed) and the bad one compiled.
  const ctx = scopedStub();
  const bad = compilePipeline(ctx, "bad(k=1)", `// BAD\n${TRIVIAL}`, "auto").then(
    () => "compiled",
    (e) => e,
  );
  const good = compilePipeline(ctx, "good(k=1)", TRIVIAL, "auto").then(() => "compiled", (e) => e);
  const [b, g] = await Promise.all([bad, good]);
  assert.ok(b instanceof ShaderCompileError, `the bad shader: ${b}`);
  assert.match(b.message, /bad shader/);
  assert.equal(g, "compiled");
});
