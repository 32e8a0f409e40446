/**
 * tests/run.ts (`deno task test`) puts every test file that changes process-wide state in its
 * serial pass: the first parallel run had one file's environment variable break another's
 * device set-up. The fixtures' calls are built from pieces, so this file itself stays in the
 * parallel pass.
 */
import assert from "node:assert/strict";
import { filesUnder, SERIAL_MARK, splitFiles, testFiles } from "./run.ts";

const ROOT = new URL("../", import.meta.url);
const call = (name: string, args = "") => `${name}(${args})`;

Deno.test("test runner: a file that sets the environment or captures fd 2 is serial", async () => {
  const dir = await Deno.makeTempDir({ dir: "/tmp" });
  try {
    const files: Record<string, string> = {
      "env_test.ts": `await ${call("with" + "Env", "{ A: '1' }, f")};`,
      "env_sync_test.ts": `${call("with" + "EnvSync", "{}, f")};`,
      "set_test.ts": `${call("Deno.env." + "set", "'A', '1'")};`,
      "delete_test.ts": `${call("Deno.env." + "delete", "'A'")};`,
      "stderr_test.ts": `${call("capture" + "Stderr", "() => 1")};`,
      "plain_test.ts": `Deno.env.get("A"); const withEnvironment = 1; // reads only`,
    };
    for (const [f, text] of Object.entries(files)) await Deno.writeTextFile(`${dir}/${f}`, text);
    const names = Object.keys(files).sort();
    const { parallel, serial } = await splitFiles(names, new URL(`file://${dir}/`));
    assert.deepEqual(parallel, ["plain_test.ts"]);
    assert.deepEqual(serial, names.filter((n) => n !== "plain_test.ts"));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("test runner: the tree's files, and where its env and stderr users land", async () => {
  const files = await testFiles();
  assert.ok(files.includes("tests/run_test.ts"), "finds this file");
  assert.ok(files.every((f) => f.startsWith("tests/") && f.endsWith("_test.ts")));
  const { parallel, serial } = await splitFiles(files);
  assert.equal(parallel.length + serial.length, files.length);
  assert.ok(parallel.includes("tests/run_test.ts"));
  // Every importer of the helpers that change process state is serial.
  const importers = [];
  for (const f of files) {
    const text = await Deno.readTextFile(new URL(f, ROOT));
    const imports = /from "[./]*(tests\/)?(support\/env|gpu\/runtime_stderr)\.ts"/.test(text);
    if (imports && f !== "tests/run_test.ts") importers.push(f);
  }
  assert.ok(importers.length >= 10, importers.join(", "));
  assert.deepEqual(importers.filter((f) => !serial.includes(f)), []);
  assert.ok(serial.includes("tests/gpu/map_read_test.ts"));
  assert.ok(serial.includes("tests/gpu/runtime_stderr_test.ts"));
});

Deno.test("test runner: no helper module under tests/ changes process state", async () => {
  // A helper that did would make its importers unsafe in the parallel pass unseen: the mark is
  // looked for in each test file's own text.
  const helpers = await filesUnder(
    new URL("tests/", ROOT),
    (name) => name.endsWith(".ts") && !name.endsWith("_test.ts"),
  );
  const exempt = ["tests/support/env.ts", "tests/run.ts"];
  const marked = [];
  for (const h of helpers) {
    if (!exempt.includes(h) && SERIAL_MARK.test(await Deno.readTextFile(new URL(h, ROOT)))) {
      marked.push(h);
    }
  }
  assert.ok(helpers.length > 10, `found ${helpers.length} helpers`);
  assert.deepEqual(marked, []);
});
