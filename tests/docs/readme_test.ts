/**
 * The README's examples, verbatim: every ```sh block of its "Using it" section runs in bash,
 * in order, against a fresh `server/main.ts` (as `deno task serve` starts it, on a free port
 * instead of 8000), and its output must equal the fenced block after it. JSON lines compare as
 * JSON, with the values of `timings` (the keys still count) and `created_at` left out; other
 * lines compare as text. Blocks whose output fence says `lavapipe` compare only where the
 * server has a WebGPU device. Skipped, saying so, without curl. `README_PRINT=1` prints what
 * each block answered; `README_WRITE=1` writes the answers into the README's output blocks
 * instead of comparing (run it, then read the diff).
 */
import assert from "node:assert/strict";
import { spawnServer } from "../server/process.ts";

const README = new URL("../../README.md", import.meta.url);

/** One example: the shell text, the expected output, and whether it needs a device. */
interface Example {
  line: number;
  sh: string;
  expected: string;
  /** Where the expected output's text sits in the markdown. */
  at: [number, number];
  needsDevice: boolean;
}

/** The sh blocks of a section and the fenced block right after each. */
export function examples(markdown: string, section: string): Example[] {
  const start = markdown.indexOf(`\n## ${section}\n`);
  assert.ok(start >= 0, `README has a "## ${section}" section`);
  const end = markdown.indexOf("\n## ", start + 4);
  const text = markdown.slice(start, end < 0 ? undefined : end);
  const fence = /```([^\n]*)\n([\s\S]*?)```/g;
  const blocks = [...text.matchAll(fence)].map((m) => ({
    info: m[1].trim(),
    body: m[2],
    bodyAt: start + m.index! + 3 + m[1].length + 1,
    line: markdown.slice(0, start + m.index!).split("\n").length,
  }));
  const out: Example[] = [];
  for (let i = 0; i < blocks.length; i++) {
    if (blocks[i].info !== "sh") continue;
    const next = blocks[i + 1];
    assert.ok(
      next && next.info !== "sh",
      `the sh block at line ${blocks[i].line} shows its output`,
    );
    out.push({
      line: blocks[i].line,
      sh: blocks[i].body,
      expected: next.body,
      at: [next.bodyAt, next.bodyAt + next.body.length],
      needsDevice: next.info.split(/\s+/).includes("lavapipe"),
    });
  }
  return out;
}

/** A JSON answer with the run-dependent values taken out. */
function normalize(v: unknown, key = ""): unknown {
  if (key === "created_at" && typeof v === "string") return "<created_at>";
  if (key === "timings" && v && typeof v === "object") {
    return Object.keys(v).sort().map((k) => `${k}: <ms>`);
  }
  if (Array.isArray(v)) return v.map((x) => normalize(x));
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, normalize(x, k)]));
  }
  return v;
}

function sameOutput(got: string, want: string): boolean {
  const g = got.trimEnd().split("\n"), w = want.trimEnd().split("\n");
  if (g.length !== w.length) return false;
  return g.every((line, i) => {
    try {
      return JSON.stringify(normalize(JSON.parse(line))) ===
        JSON.stringify(normalize(JSON.parse(w[i])));
    } catch {
      return line === w[i];
    }
  });
}

const hasCurl = new Deno.Command("bash", { args: ["-c", "command -v curl"], stdout: "null" })
  .outputSync().success;
if (!hasCurl) console.log("readme_test: skipped: curl is not installed");

Deno.test({
  name: "README: every example of 'Using it' runs verbatim and answers what it shows",
  ignore: !hasCurl,
  async fn() {
    const markdown = await Deno.readTextFile(README);
    const list = examples(markdown, "Using it");
    const write = Deno.env.get("README_WRITE") === "1";
    const answers: string[] = [];
    assert.ok(list.length >= 5, `${list.length} examples`);
    const srv = await spawnServer([]);
    const dir = await Deno.makeTempDir({ prefix: "attn-readme-" });
    try {
      const device = await (await fetch(`${srv.url}/v1/device`)).json();
      for (const ex of list) {
        const sh = ex.sh.replaceAll("127.0.0.1:8000", `127.0.0.1:${srv.port}`);
        const run = await new Deno.Command("bash", { args: ["-c", sh], cwd: dir, stderr: "piped" })
          .output();
        const got = new TextDecoder().decode(run.stdout);
        if (Deno.env.get("README_PRINT")) console.log(`--- line ${ex.line}\n${got}`);
        assert.equal(run.code, 0, `line ${ex.line}: ${new TextDecoder().decode(run.stderr)}`);
        answers.push(got.endsWith("\n") ? got : `${got}\n`);
        if (write || (ex.needsDevice && !device.available)) continue;
        assert.ok(
          sameOutput(got, ex.expected),
          `README line ${ex.line}: the example answered\n${got}\nbut the README shows\n${ex.expected}`,
        );
      }
      if (write) {
        let md = markdown;
        for (let i = list.length - 1; i >= 0; i--) {
          md = md.slice(0, list[i].at[0]) + answers[i] + md.slice(list[i].at[1]);
        }
        await Deno.writeTextFile(README, md);
      }
    } finally {
      srv.kill("SIGTERM");
      await srv.exited;
      await Deno.remove(dir, { recursive: true });
    }
  },
});
