/**
 * examples/python_client.py runs against a real server and passes its own float64 checks (it
 * exits 1 on an answer off by more than its tolerance). Skipped where there is no python3.
 */
import assert from "node:assert/strict";
import { startServer } from "../server/helpers.ts";

const python = await new Deno.Command("python3", { args: ["--version"], stdout: "null" })
  .output().then((o) => o.success, () => false);

if (!python) console.warn("python example test skipped: no python3 on this machine");

Deno.test("examples/python_client.py: its checks pass", { ignore: !python }, async () => {
  const srv = await startServer();
  try {
    const script = new URL("../../examples/python_client.py", import.meta.url).pathname;
    const out = await new Deno.Command("python3", { args: [script, srv.url] }).output();
    const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, text);
    assert.match(text, /^prefill CPU_REFERENCE /m);
    assert.match(text, /^delete -> 204$/m);
  } finally {
    await srv.close();
  }
});
