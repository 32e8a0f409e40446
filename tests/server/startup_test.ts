/**
 * server/main.ts's start-up refusals, on real processes: a port it cannot serve (in use, or a
 * host that does not resolve) is one line naming host:port and the OS error in every serving
 * mode, exit 1 (it was an uncaught AddrInUse with a stack trace but with `--http-workers`); a
 * bad backend variable (ATTN_DECODE_TUNING, ATTN_PREFILL_MMA_SHAPE, ATTN_FLASH_TILE) is one
 * line naming it, exit 2, where it crashed the process as the backends loaded, `--help` and
 * `--no-gpu` included; the GPU layer's variables are refused the same way (tests of each rule:
 * serve_env_test.ts); a loopback bind other than 127.0.0.1 answers requests addressed to it.
 */
import assert from "node:assert/strict";
import { runServerToExit, spawnServer } from "./process.ts";

/** The lines of `stderr` that are not the start-up lines every run prints. */
function faultLines(stderr: string): string[] {
  const startup = /^(device thread \d+: )?(auth: |webgpu: |device threads: |http workers: )/;
  return stderr.split("\n").filter((l) => l !== "" && !startup.test(l));
}

Deno.test({
  name: "main: a port in use is one line naming host:port and the OS error, every mode",
  sanitizeResources: false,
  async fn() {
    const first = await spawnServer(["--no-gpu"]);
    try {
      for (
        const mode of [
          [],
          ["--http-workers", "1"],
          ["--device-threads", "1"],
          ["--device-threads", "1", "--device-threads-http"],
        ]
      ) {
        const r = await runServerToExit(
          ["--no-gpu", "--port", String(first.port), ...mode],
          { XDG_RUNTIME_DIR: "/tmp" },
          30_000,
        );
        const what = mode.join(" ") || "one thread";
        assert.equal(r.code, 1, `${what}: ${r.stderr}`);
        const lines = faultLines(r.stderr);
        assert.equal(lines.length, 1, `${what}: ${r.stderr}`);
        assert.match(
          lines[0],
          new RegExp(
            `^cannot serve on 127\\.0\\.0\\.1:${first.port}\\b.*: .*Address already in use`,
          ),
          what,
        );
      }
    } finally {
      first.kill("SIGTERM");
      await first.exited;
    }
  },
});

Deno.test("main: a --host that does not resolve is one line, exit 1", async () => {
  const r = await runServerToExit(
    ["--no-gpu", "--host", "bogus.invalid", "--port", "18251"],
    { ATTN_TOKEN: "t" },
  );
  assert.equal(r.code, 1, r.stderr);
  const lines = faultLines(r.stderr);
  assert.equal(lines.length, 1, r.stderr);
  assert.match(lines[0], /^cannot serve on bogus\.invalid:18251: \S/);
});

Deno.test("main: a bad backend variable is one line (exit 2); --help still answers", async () => {
  const cases: [string, string, RegExp][] = [
    ["ATTN_DECODE_TUNING", "{x", /^ATTN_DECODE_TUNING must be a JSON object of .*, got "\{x": /],
    [
      "ATTN_DECODE_TUNING",
      '{"bogus_knob":1}',
      /^ATTN_DECODE_TUNING must be a JSON object of .*, got "\{\\"bogus_knob\\":1\}": .*bogus_knob/,
    ],
    ["ATTN_DECODE_TUNING", "[1]", /^ATTN_DECODE_TUNING must be a JSON object of .*, got "\[1\]"/],
    [
      "ATTN_PREFILL_MMA_SHAPE",
      "nosuch",
      /^ATTN_PREFILL_MMA_SHAPE="nosuch" names no shape; known: /,
    ],
    ["ATTN_FLASH_TILE", "abc", /^ATTN_FLASH_TILE must be a tile TXxTYxRMxRN .*, got "abc": /],
    ["ATTN_KERNEL_CACHE_LIMIT", "abc", /^ATTN_KERNEL_CACHE_LIMIT must be an integer >= 1/],
    ["ATTN_GPU_POOL_MAX_FREE_BYTES", "1GiB", /^ATTN_GPU_POOL_MAX_FREE_BYTES must be an integer/],
  ];
  for (const [name, value, want] of cases) {
    const r = await runServerToExit(["--no-gpu", "--port", "0"], { [name]: value }, 15_000);
    assert.equal(r.code, 2, `${name}=${value}: ${r.stderr}`);
    const lines = r.stderr.split("\n").filter((l) => l !== "");
    assert.equal(lines.length, 1, `${name}=${value}: ${r.stderr}`);
    assert.match(lines[0], want);
  }
  for (const [name, value] of [["ATTN_DECODE_TUNING", "{x"], ["ATTN_PREFILL_MMA_SHAPE", "x"]]) {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-read",
        "--allow-env",
        new URL("../../server/main.ts", import.meta.url)
          .pathname,
        "--help",
      ],
      env: { [name]: value },
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    assert.match(new TextDecoder().decode(out.stdout), /^attention service: /);
  }
});

Deno.test("main: --host 127.0.0.2 answers requests addressed to it", async () => {
  const srv = await spawnServer(["--no-gpu", "--host", "127.0.0.2"]);
  try {
    assert.match(srv.url, /^http:\/\/127\.0\.0\.2:\d+$/);
    const r = await fetch(`${srv.url}/v1/backends`);
    assert.equal(r.status, 200, await r.text());
    assert.match(srv.stderr(), /Host: localhost, 127\.0\.0\.1, \[::1\], 127\.0\.0\.2$/m);
  } finally {
    srv.kill("SIGTERM");
    await srv.exited;
  }
});

Deno.test("main: the longest --shutdown-deadline-ms drains without a timer overflow", async () => {
  // The device threads' drain waited deadline + grace, past setTimeout's longest at the cap:
  // the timer fired at once and the drain reported a silent thread, exit 1.
  for (const mode of [[], ["--device-threads", "1", "--device-threads-http"]]) {
    const srv = await spawnServer(["--no-gpu", "--shutdown-deadline-ms", "2147483647", ...mode]);
    // An answer first: the signal handlers are installed once the port is served.
    await (await fetch(`${srv.url}/healthz`)).body?.cancel();
    srv.kill("SIGTERM");
    const { code, stderr } = await srv.exited;
    const what = mode.join(" ") || "one thread";
    assert.equal(code, 0, `${what}: ${stderr}`);
    assert.doesNotMatch(stderr, /TimeoutOverflowWarning/, what);
    assert.match(stderr, /stopped: every call finished/, what);
  }
});
