/**
 * Compile probe: compiles WGSL files on the chosen runtime's device and prints each compile's
 * time, to isolate the H200 compiles that never finished (bench/NOTES.md v0.6, v0.7).
 *
 * ```sh
 * deno run -A bench/compile_probe.ts [--runtime dawn] [--together] [--repeat N] [--salt] FILE...
 * ```
 * Default: the files one after another, each through gpu/pipelines.ts's `compilePipeline`
 * (error scopes, `getCompilationInfo`, `createComputePipelineAsync`, the compile bound of
 * `ATTN_COMPILE_TIMEOUT_MS`). `--together` starts all of a round's compiles at once, as the
 * service does for a split kernel and its reduce. `--repeat N` runs N rounds; `--salt` adds a
 * comment naming the round to each source, so no cache of the runtime or the driver answers.
 * `--raw` compiles without error scopes and compilation info (only the pipeline call).
 * `--dispatch` also runs each compiled pipeline once on zeroed buffers (one workgroup, bound
 * through an explicit layout read from the source's `@binding` lines) and prints how long
 * `queue.submit` itself took (a driver that compiles at first use blocks there) and the wait
 * for the work. Prints
 * one line per compile, `ok` with ms or `FAILED` with the reason, and a summary; exits 1 if any
 * failed. A compile that never returns leaves the process waiting: run it under `timeout`.
 * @module
 */
import { compilePipeline } from "../gpu/pipelines.ts";
import { benchDevice } from "./bench_device.ts";

interface ProbeArgs {
  runtime?: string;
  together: boolean;
  repeat: number;
  salt: boolean;
  raw: boolean;
  dispatch: boolean;
  files: string[];
}

function parseArgs(argv: string[]): ProbeArgs {
  const a: ProbeArgs = {
    together: false,
    repeat: 1,
    salt: false,
    raw: false,
    dispatch: false,
    files: [],
  };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i];
    if (v === "--runtime") a.runtime = argv[++i];
    else if (v === "--together") a.together = true;
    else if (v === "--salt") a.salt = true;
    else if (v === "--raw") a.raw = true;
    else if (v === "--dispatch") a.dispatch = true;
    else if (v === "--repeat") a.repeat = Math.max(1, Number(argv[++i]) || 1);
    else a.files.push(v);
  }
  return a;
}

const args = parseArgs(Deno.args);
if (args.files.length === 0) {
  console.error("usage: compile_probe.ts [--runtime R] [--together] [--repeat N] [--salt] FILE...");
  Deno.exit(2);
}
const { device, gpu } = await benchDevice(args.runtime);
const sources = args.files.map((f) => ({
  name: f.split("/").pop()!,
  code: Deno.readTextFileSync(f),
}));

/** The group-0 bindings declared in `code`: index and buffer binding type. */
function declaredBindings(code: string): { binding: number; type: GPUBufferBindingType }[] {
  const re = /@group\(0\)\s*@binding\((\d+)\)\s*var<([\w, ]+)>/g;
  return [...code.matchAll(re)].map((m) => ({
    binding: Number(m[1]),
    type: m[2] === "uniform"
      ? "uniform"
      : m[2].includes("read_write")
      ? "storage"
      : "read-only-storage",
  }));
}

function explicitLayout(code: string): GPUBindGroupLayout {
  return gpu.device.createBindGroupLayout({
    entries: declaredBindings(code).map(({ binding, type }) => ({
      binding,
      visibility: GPUShaderStage.COMPUTE,
      buffer: { type },
    })),
  });
}

/** Runs `pipeline` once on zeroed buffers; returns "submit X ms, wait Y ms". */
async function dispatchOnce(
  pipeline: GPUComputePipeline,
  layout: GPUBindGroupLayout,
  code: string,
): Promise<string> {
  const dev = gpu.device;
  const buffers = declaredBindings(code).map(({ binding, type }) => ({
    binding,
    buffer: dev.createBuffer({
      size: type === "uniform" ? 256 : 1 << 16,
      usage: type === "uniform" ? GPUBufferUsage.UNIFORM : GPUBufferUsage.STORAGE,
    }),
  }));
  const group = dev.createBindGroup({
    layout,
    entries: buffers.map(({ binding, buffer }) => ({ binding, resource: { buffer } })),
  });
  const enc = dev.createCommandEncoder();
  const pass = enc.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(0, group);
  pass.dispatchWorkgroups(1);
  pass.end();
  const t0 = performance.now();
  dev.queue.submit([enc.finish()]);
  const t1 = performance.now();
  await dev.queue.onSubmittedWorkDone();
  const t2 = performance.now();
  for (const b of buffers) b.buffer.destroy();
  return `submit ${(t1 - t0).toFixed(0)} ms, wait ${(t2 - t1).toFixed(0)} ms`;
}

async function compileOne(name: string, code: string): Promise<string> {
  const t0 = performance.now();
  try {
    const layout = args.dispatch ? explicitLayout(code) : "auto";
    let pipeline: GPUComputePipeline;
    if (args.raw) {
      const module = gpu.device.createShaderModule({ label: name, code });
      pipeline = await gpu.device.createComputePipelineAsync({
        label: name,
        layout: layout === "auto"
          ? "auto"
          : gpu.device.createPipelineLayout({ bindGroupLayouts: [layout] }),
        compute: { module, entryPoint: "main" },
      });
    } else {
      pipeline = await compilePipeline(gpu, name, code, layout);
    }
    const compiled = `ok ${(performance.now() - t0).toFixed(0)} ms`;
    if (layout === "auto") return compiled;
    return `${compiled}; run once: ${await dispatchOnce(pipeline, layout, code)}`;
  } catch (e) {
    failures++;
    const msg = e instanceof Error ? e.message : String(e);
    return `FAILED after ${(performance.now() - t0).toFixed(0)} ms: ${msg.slice(0, 300)}`;
  }
}

let failures = 0;
for (let round = 0; round < args.repeat; round++) {
  const code = (s: { code: string }) =>
    args.salt ? `// round ${round} ${Date.now()}\n${s.code}` : s.code;
  if (args.together) {
    const res = await Promise.all(sources.map((s) => compileOne(s.name, code(s))));
    res.forEach((r, i) => console.log(`round ${round} ${sources[i].name}: ${r}`));
  } else {
    for (const s of sources) {
      console.log(`round ${round} ${s.name}: ${await compileOne(s.name, code(s))}`);
    }
  }
}
console.log(`compile_probe: ${args.repeat * sources.length - failures} ok, ${failures} failed`);
device.close();
Deno.exit(failures ? 1 : 0);
