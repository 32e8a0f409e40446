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
 * `--raw` compiles without error scopes and compilation info (only the pipeline call). Prints
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
  files: string[];
}

function parseArgs(argv: string[]): ProbeArgs {
  const a: ProbeArgs = { together: false, repeat: 1, salt: false, raw: false, files: [] };
  for (let i = 0; i < argv.length; i++) {
    const v = argv[i];
    if (v === "--runtime") a.runtime = argv[++i];
    else if (v === "--together") a.together = true;
    else if (v === "--salt") a.salt = true;
    else if (v === "--raw") a.raw = true;
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

async function compileOne(name: string, code: string): Promise<string> {
  const t0 = performance.now();
  try {
    if (args.raw) {
      const module = gpu.device.createShaderModule({ label: name, code });
      await gpu.device.createComputePipelineAsync({
        label: name,
        layout: "auto",
        compute: { module, entryPoint: "main" },
      });
    } else {
      await compilePipeline(gpu, name, code);
    }
    return `ok ${(performance.now() - t0).toFixed(0)} ms`;
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
