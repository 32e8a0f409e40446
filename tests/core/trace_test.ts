import assert from "node:assert/strict";

Deno.test("trace: ATTN_TRACE_FILE gets one timestamped line per call; unset, nothing is written", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = `${dir}/trace.txt`;
    const script = `import { trace } from "${new URL("../../core/trace.ts", import.meta.url)}";
trace("first step"); trace("second step");`;
    const run = (env: Record<string, string>) =>
      new Deno.Command(Deno.execPath(), {
        args: ["eval", "--no-check", script],
        env,
        clearEnv: false,
      }).output();
    assert.equal((await run({ ATTN_TRACE_FILE: file })).code, 0);
    const lines = (await Deno.readTextFile(file)).trim().split("\n");
    assert.equal(lines.length, 2);
    assert.match(lines[0], /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z first step$/);
    assert.match(lines[1], / second step$/);
    await Deno.remove(file);
    assert.equal((await run({ ATTN_TRACE_FILE: "" })).code, 0);
    await assert.rejects(Deno.stat(file), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("trace: a file the process may not write is said once on stderr, naming the flag", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = `${dir}/trace.txt`;
    const script = `import { trace } from "${new URL("../../core/trace.ts", import.meta.url)}";
trace("first step"); trace("second step"); console.log("ran");`;
    const out = await new Deno.Command(Deno.execPath(), {
      // As `deno task serve` runs: read and env, no write.
      args: [
        "run",
        "--no-check",
        "--allow-read",
        "--allow-env",
        `data:text/javascript,${encodeURIComponent(script)}`,
      ],
      env: { ATTN_TRACE_FILE: file },
      clearEnv: false,
    }).output();
    const err = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, err);
    assert.equal(new TextDecoder().decode(out.stdout).trim(), "ran");
    const said = err.split("\n").filter((l) => l.includes("ATTN_TRACE_FILE"));
    assert.equal(said.length, 1, err);
    assert.match(
      said[0],
      new RegExp(`${file.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}.*--allow-write=`),
    );
    await assert.rejects(Deno.stat(file), Deno.errors.NotFound);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
