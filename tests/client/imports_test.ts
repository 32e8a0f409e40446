/**
 * Layering of the wire contract, from the module graph Deno resolves (`deno info --json`, so
 * transitive and type-only imports count): the client reaches nothing in server/ or service/
 * (nor backends/ or gpu/), and wire/ reaches only core/, itself and npm packages.
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
