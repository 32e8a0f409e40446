/**
 * Layering of the wire contract, from the module graph Deno resolves (`deno info --json`, so
 * transitive and type-only imports count): the client reaches nothing in server/ or service/
 * (nor backends/ or gpu/), and wire/ reaches only core/, itself and npm packages.
 *
 * And the WebGPU runtime rules, from the source text of tests/, gpu/, backends/, service/ and
 * server/ (comments and literals left out): only gpu/runtime.ts touches `navigator.gpu`, and no
 * test builds a WebGpuDeviceManager without a runtime (that is Deno's whatever
 * `ATTN_WEBGPU_RUNTIME` says): tests take their device from tests/support/gpu.ts, so the GPU
 * suite runs unchanged on either runtime. A breach fails with its file and line.
 */
import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url);

/** The repository-relative paths of every local module `entry` reaches. */
async function graph(entry: string): Promise<string[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "--config", new URL("deno.json", ROOT).pathname, entry],
    cwd: ROOT.pathname,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  const info = JSON.parse(new TextDecoder().decode(out.stdout));
  return (info.modules as { specifier: string }[])
    .map((m) => m.specifier)
    .filter((s) => s.startsWith(ROOT.href))
    .map((s) => s.slice(ROOT.href.length));
}

Deno.test("client/ imports nothing from server/ or service/ (nor backends/, gpu/)", async () => {
  const mods = await graph("client/client.ts");
  assert.ok(mods.includes("wire/schemas.ts"), `the graph was read: ${mods.join(" ")}`);
  const bad = mods.filter((m) => /^(server|service|backends|gpu)\//.test(m));
  assert.deepEqual(bad, [], `client/client.ts reaches ${bad.join(", ")}`);
});

Deno.test("wire/ reaches only core/ and wire/", async () => {
  for (const f of Deno.readDirSync(new URL("wire/", ROOT))) {
    if (!f.name.endsWith(".ts")) continue;
    const mods = await graph(`wire/${f.name}`);
    const bad = mods.filter((m) => !/^(core|wire)\//.test(m));
    assert.deepEqual(bad, [], `wire/${f.name} reaches ${bad.join(", ")}`);
  }
});

/**
 * `src` with comments, string and template literals and regular expression literals blanked
 * (newlines kept, so offsets and line numbers still hold): what is left is code.
 */
function codeOnly(src: string): string {
  const out = src.split("");
  const blank = (from: number, to: number) => {
    for (let j = from; j < to; j++) if (out[j] !== "\n") out[j] = " ";
  };
  let prev = ""; // the last code character seen (a `/` after it starts a regex, or divides)
  let i = 0;
  while (i < src.length) {
    const c = src[i], n = src[i + 1];
    if (c === "/" && n === "/") {
      const e = src.indexOf("\n", i);
      const end = e < 0 ? src.length : e;
      blank(i, end);
      i = end;
    } else if (c === "/" && n === "*") {
      const e = src.indexOf("*/", i + 2);
      const end = e < 0 ? src.length : e + 2;
      blank(i, end);
      i = end;
    } else if (
      c === '"' || c === "'" || c === "`" || (c === "/" && /^$|[(,=:[!&|?{};+\-*%<>~^]/.test(prev))
    ) {
      let j = i + 1, inClass = false;
      while (j < src.length && (src[j] !== c || inClass)) {
        if (src[j] === "\\") j++;
        else if (c === "/" && src[j] === "[") inClass = true;
        else if (c === "/" && src[j] === "]") inClass = false;
        else if (c === "/" && src[j] === "\n") break; // not a regex after all
        j++;
      }
      blank(i + 1, j);
      prev = c;
      i = j + 1;
    } else {
      if (!/\s/.test(c)) prev = c;
      i++;
    }
  }
  return out.join("");
}

/** Where a module reaches `navigator.gpu` (directly, optionally, through a cast, destructured). */
const NAVIGATOR_GPU = [
  /\bnavigator\s*(?:\?\.|\.)\s*gpu\b/g,
  /\bnavigator\s+as\s+[^)]*\)\s*(?:\?\.|\.)\s*gpu\b/g,
  /\bnavigator\s*(?:\?\.)?\s*\[/g,
  /\{[^}]*\bgpu\b[^}]*\}\s*=\s*(?:globalThis\s*\.\s*)?navigator\b/g,
];
/** The one module allowed to touch `navigator.gpu` (Deno's runtime, gpu/runtime.ts). */
const NAVIGATOR_GPU_OWNER = "gpu/runtime.ts";

/** `new WebGpuDeviceManager(...)` given neither `runtime` nor `selection` (Deno's by default). */
function managersWithoutRuntime(code: string): number[] {
  const at: number[] = [];
  for (const m of code.matchAll(/\bnew\s+WebGpuDeviceManager\s*\(/g)) {
    let depth = 1, j = m.index! + m[0].length;
    const from = j;
    while (j < code.length && depth > 0) {
      if (code[j] === "(") depth++;
      else if (code[j] === ")") depth--;
      j++;
    }
    const arg = code.slice(from, j - 1).trim();
    // An options variable or a spread may carry the runtime; an empty call or a literal
    // without either key gets Deno's runtime whatever ATTN_WEBGPU_RUNTIME says.
    if (arg === "" || (arg.startsWith("{") && !/\b(?:runtime|selection)\b|\.\.\./.test(arg))) {
      at.push(m.index!);
    }
  }
  return at;
}

/** The WebGPU rules' breaches in `code` of repository file `path`, as "path:line: what". */
function webGpuRuleBreaches(path: string, src: string): string[] {
  const code = codeOnly(src);
  const line = (at: number) => code.slice(0, at).split("\n").length;
  const text = (at: number) => src.split("\n")[line(at) - 1].trim();
  const out: string[] = [];
  if (path !== NAVIGATOR_GPU_OWNER) {
    const seen = new Set<number>();
    for (const re of NAVIGATOR_GPU) {
      for (const m of code.matchAll(re)) {
        if (seen.has(line(m.index!))) continue;
        seen.add(line(m.index!));
        out.push(
          `${path}:${line(m.index!)}: navigator.gpu outside ${NAVIGATOR_GPU_OWNER} ` +
            `(take a runtime from gpu/runtime.ts; tests: tests/support/gpu.ts): ${text(m.index!)}`,
        );
      }
    }
  }
  if (path.startsWith("tests/")) {
    for (const at of managersWithoutRuntime(code)) {
      out.push(
        `${path}:${line(at)}: a WebGpuDeviceManager without a runtime runs on Deno's whatever ` +
          `ATTN_WEBGPU_RUNTIME says (use newManager() from tests/support/gpu.ts): ${text(at)}`,
      );
    }
  }
  return out.sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
}

/** Every .ts file under `dir` (repository-relative paths). */
function* sources(dir: string): Generator<string> {
  for (const e of Deno.readDirSync(new URL(dir, ROOT))) {
    if (e.isDirectory) yield* sources(`${dir}${e.name}/`);
    else if (e.isFile && e.name.endsWith(".ts")) yield `${dir}${e.name}`;
  }
}

Deno.test("source rules: the WebGPU rules' scan finds what it must, and only that", () => {
  const bad = [
    "const a = await navigator.gpu.requestAdapter();",
    "const b = navigator?.gpu;",
    "const c = (globalThis.navigator as Navigator | undefined)?.gpu ?? null;",
    "const { gpu } = navigator;",
    'const d = navigator["gpu"];',
    "const m = new WebGpuDeviceManager();",
    "const n = new WebGpuDeviceManager({ powerPreference: 'low-power' });",
  ].join("\n");
  const found = webGpuRuleBreaches("tests/x_test.ts", bad).map((s) => s.split(": ")[0]);
  assert.deepEqual(found, [1, 2, 3, 4, 5, 6, 7].map((l) => `tests/x_test.ts:${l}`));
  const fine = [
    "// navigator.gpu in a comment; new WebGpuDeviceManager() too",
    "/* navigator.gpu */ const s = 'navigator.gpu is undefined';",
    "const r = /navigator\\.gpu is undefined/; const t = `new WebGpuDeviceManager()`;",
    "const cores = navigator.hardwareConcurrency;",
    "const m = new WebGpuDeviceManager({ selection: SELECTION });",
    "const n = new WebGpuDeviceManager({ runtime: runtimeFromGpu(fake, { name: 'f' }) });",
    "const o = new WebGpuDeviceManager({ ...opts, powerPreference: 'low-power' });",
    "const x = a / b; const y = c / d; // navigator.gpu",
  ].join("\n");
  assert.deepEqual(webGpuRuleBreaches("tests/y_test.ts", fine), []);
  // The owner may reach it; outside tests/ a manager may take Deno's runtime by default.
  assert.deepEqual(webGpuRuleBreaches(NAVIGATOR_GPU_OWNER, bad), []);
  assert.equal(webGpuRuleBreaches("server/x.ts", bad).length, 5);
});

Deno.test("source rules: only gpu/runtime.ts touches navigator.gpu; tests' managers get a runtime", () => {
  const breaches: string[] = [];
  let files = 0;
  for (const dir of ["tests/", "gpu/", "backends/", "service/", "server/"]) {
    for (const path of sources(dir)) {
      files++;
      breaches.push(...webGpuRuleBreaches(path, Deno.readTextFileSync(new URL(path, ROOT))));
    }
  }
  assert.ok(files > 100, `the sources were read: ${files} files`);
  assert.deepEqual(breaches, [], `\n${breaches.join("\n")}`);
});
