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
