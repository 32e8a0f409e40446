/**
 * deploy/start.sh runs its instances with the permissions `deno task serve` has (deno.json): it
 * had no --allow-ffi, so `-- --webgpu-runtime dawn` instances died loading Dawn, and no
 * --allow-run, so `--keep-warm-mode process` stayed off.
 */
import assert from "node:assert/strict";

Deno.test("deploy/start.sh: instances get the serve task's permissions", async () => {
  const config = JSON.parse(await Deno.readTextFile(new URL("../../deno.json", import.meta.url)));
  const serve: string = config.tasks.serve;
  const want = serve.split(/\s+/).filter((a) => a.startsWith("--allow-")).sort();
  assert.ok(want.includes("--allow-ffi") && want.includes("--allow-run"), serve);
  const script = await Deno.readTextFile(new URL("../../deploy/start.sh", import.meta.url));
  const m = script.match(/^serve_perms="([^"]*)"$/m);
  assert.ok(m, "start.sh names its instances' permissions in serve_perms");
  assert.deepEqual(m[1].split(/\s+/).sort(), want);
  assert.match(script, /run --config "\$repo\/deno.json" \$serve_perms/);
});
