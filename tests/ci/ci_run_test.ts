/**
 * `.ci/run --parse`: CI shows only the end of its output, so a failing pass's failed tests (names,
 * places, the first lines of their errors) are printed there, before the totals line. Stop 27's CI
 * failed with one test 900 tests above the tail, out of sight.
 */
import assert from "node:assert/strict";

const CI_RUN = new URL("../../.ci/run", import.meta.url).pathname;

async function parse(logs: Record<string, string>): Promise<{ code: number; lines: string[] }> {
  const dir = await Deno.makeTempDir({ prefix: "ci_run_test_" });
  try {
    const paths: string[] = [];
    for (const [name, text] of Object.entries(logs)) {
      paths.push(`${dir}/${name}.log`);
      await Deno.writeTextFile(paths.at(-1)!, text);
    }
    const out = await new Deno.Command("bash", {
      args: [CI_RUN, "--parse", ...paths],
      stdout: "piped",
      stderr: "piped",
    })
      .output();
    const text = new TextDecoder().decode(out.stdout);
    return { code: out.code, lines: text.trimEnd().split("\n") };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const grey = (s: string) => `\x1b[0m\x1b[38;5;245m${s}\x1b[0m`;
const FAILING_LOG = [
  grey("running 2 tests from ./tests/x_test.ts"),
  `fine ... \x1b[0m\x1b[32mok\x1b[0m ${grey("(1ms)")}`,
  `queue bound ... \x1b[0m\x1b[31mFAILED\x1b[0m ${grey("(3ms)")}`,
  "",
  "\x1b[0m\x1b[1m\x1b[37m\x1b[41m ERRORS \x1b[0m",
  "",
  `queue bound \x1b[0m\x1b[38;5;245m=> ./tests/x_test.ts:10:6\x1b[0m`,
  "\x1b[0m\x1b[1m\x1b[31merror\x1b[0m: AssertionError: Values are not equal: 503 != 200",
  "    at queue bound (file:///tmp/x_test.ts:12:3)",
  "",
  "\x1b[0m\x1b[1m\x1b[37m\x1b[41m FAILURES \x1b[0m",
  "",
  `queue bound \x1b[0m\x1b[38;5;245m=> ./tests/x_test.ts:10:6\x1b[0m`,
  "",
  `\x1b[0m\x1b[31mFAILED\x1b[0m | 1 passed | 1 failed ${grey("(5ms)")}`,
  "",
].join("\n");
const CLEAN_LOG = `ok | 146 passed (18 steps) | 0 failed | 13 ignored (57s)\n`;

Deno.test("ci --parse: a failing pass's failed tests and errors come last, before the totals", async () => {
  const { code, lines } = await parse({ default: FAILING_LOG, gl: CLEAN_LOG });
  assert.deepEqual(code, 1);
  assert.deepEqual(lines.at(-1), "147 passed, 1 failed");
  const report = lines.slice(0, -1).join("\n");
  assert(report.includes("ci: errors in the default pass:"), report);
  assert(report.includes("AssertionError: Values are not equal: 503 != 200"), report);
  assert(report.includes("ci: failed tests:\n  queue bound => ./tests/x_test.ts:10:6"), report);
  assert(!report.includes("\x1b["), "colour codes are stripped");
  assert(!report.includes("gl pass"), "a clean pass prints nothing");
});

Deno.test("ci --parse: clean passes print only the totals; a pass with no summary, its last lines", async () => {
  const clean = await parse({ default: CLEAN_LOG });
  assert.deepEqual(clean, { code: 0, lines: ["146 passed, 0 failed"] });
  const died = await parse({
    default: CLEAN_LOG,
    gl: 'running 3 tests\nerror: Module not found "x.ts"\n',
  });
  assert.deepEqual(died.code, 1);
  assert.deepEqual(died.lines.slice(0, 3), [
    "ci: the gl pass ended:",
    "  running 3 tests",
    '  error: Module not found "x.ts"',
  ]);
  assert.deepEqual(died.lines.at(-1), "146 passed, 0 failed");
});

/** Runs `.ci/run` with fake `deno`, `dpkg` and `nginx` first on PATH; `deno task test` runs `pass`. */
async function runWithFakes(pass: string): Promise<{ code: number; out: string }> {
  const dir = await Deno.makeTempDir({ prefix: "ci_run_fakes_" });
  try {
    const script = (body: string) => `#!/usr/bin/env bash\n${body}\n`;
    await Deno.writeTextFile(
      `${dir}/deno`,
      script(`case "$1" in
  --version) echo "deno 2.9.6 (fake)";;
  task) ${pass};;
  *) echo "ok | 5 passed | 0 failed (1s)";;
esac`),
    );
    await Deno.writeTextFile(`${dir}/dpkg`, script("exit 0"));
    await Deno.writeTextFile(`${dir}/nginx`, script("exit 0"));
    for (const f of ["deno", "dpkg", "nginx"]) await Deno.chmod(`${dir}/${f}`, 0o755);
    const out = await new Deno.Command("bash", {
      args: [CI_RUN],
      env: { PATH: `${dir}:${Deno.env.get("PATH")}`, CI_LOG_DIR: `${dir}/logs` },
      stdout: "piped",
      stderr: "null",
    }).output();
    return { code: out.code, out: new TextDecoder().decode(out.stdout) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("ci run: a pass that dies after a clean summary says so at the end", async () => {
  // Three aborts (status 134) after a clean summary: run again twice, then it counts.
  const died = await runWithFakes(
    'echo "ok | 7 passed | 0 failed (1s)"; echo "free(): corrupted"; exit 134',
  );
  assert.equal(died.code, 1);
  const lines = died.out.trimEnd().split("\n");
  assert.equal(lines.at(-1), "12 passed, 0 failed");
  const end = lines.slice(-5).join("\n");
  assert.match(end, /ci: the default pass exited with status 134 after a clean summary:/);
  assert.match(end, /free\(\): corrupted/);
  const clean = await runWithFakes('echo "ok | 7 passed | 0 failed (1s)"');
  assert.equal(clean.code, 0);
  assert.doesNotMatch(clean.out, /ci: the .* pass/);
});
