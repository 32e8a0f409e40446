/**
 * The library selector refuses the head sizes HTTP refuses, in the same words: the shared size
 * rule (core/cache_spec.ts SPEC_SIZE_RULE, an integer in [1, 2^31 - 1]). `select` took any
 * safe integer (2^31 picked CPU_REFERENCE) while `POST /v1/backends/select` answered 400.
 * @module
 */
import assert from "node:assert/strict";
import { BackendRegistry, selectorConfigDefaults } from "../../backends/registry.ts";
import { builtinBackends } from "../../backends/index.ts";
import { ruleProblem, ruleText, SPEC_SIZE_RULE } from "../../core/cache_spec.ts";
import { ServiceError } from "../../core/errors.ts";
import type { SelectorConfig } from "../../core/types.ts";
import { AttentionApiError } from "../../client/client.ts";
import { startServer } from "../server/helpers.ts";

const OVER = [2 ** 31, 2 ** 31 + 1, 2 ** 40, Number.MAX_SAFE_INTEGER, 0, -1, 2.5];

function catchErr(fn: () => unknown): ServiceError {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof ServiceError, `a ServiceError, not ${e}`);
    return e;
  }
  assert.fail("expected a refusal");
}

/** Asserts `e` is the 400 naming head_size = `v` in the size rule's words. */
function refused(e: ServiceError, v: number): void {
  const message = ruleProblem(SPEC_SIZE_RULE, v)!;
  assert.equal(message, `must be an integer in [1, 2147483647], got ${v}`);
  assert.equal(e.status, 400, `${v}`);
  assert.equal(e.code, "invalid_request");
  assert.deepEqual(e.issues, [{ path: ["head_size"], message }]);
  assert.equal(e.message, `selector config: head_size ${message}`);
}

Deno.test("select/selectorConfigDefaults: a head_size over 2^31 - 1 is a 400 in the size rule's words", () => {
  const reg = new BackendRegistry(builtinBackends(), () => null);
  for (const head_size of OVER) {
    refused(catchErr(() => selectorConfigDefaults({ head_size, dtype: "float32" })), head_size);
    const raw: SelectorConfig = { ...selectorConfigDefaults({ head_size: 64, dtype: "float32" }) };
    raw.head_size = head_size;
    refused(catchErr(() => reg.select(raw)), head_size);
    refused(catchErr(() => reg.select(raw, { backend: "CPU_REFERENCE" })), head_size);
  }
  assert.equal(reg.cacheSize(), 0, "no refused config is cached");
  // The rule's edges are taken.
  for (const head_size of [1, 2 ** 31 - 1]) {
    const got = reg.select(selectorConfigDefaults({ head_size, dtype: "float32" }));
    assert.equal(got.backend.name, "CPU_REFERENCE");
  }
});

Deno.test("select: the library and POST /v1/backends/select refuse the same head sizes alike", async () => {
  const srv = await startServer();
  try {
    for (const head_size of OVER) {
      let http: AttentionApiError | null = null;
      try {
        await srv.client.select({ head_size, dtype: "float32" });
      } catch (e) {
        assert.ok(e instanceof AttentionApiError, `${e}`);
        http = e;
      }
      assert.ok(http, `HTTP took head_size ${head_size}`);
      assert.equal(http.status, 400);
      assert.equal(http.code, "invalid_request");
      const cfg = { ...selectorConfigDefaults({ head_size: 64, dtype: "float32" }), head_size };
      const lib = catchErr(() => srv.service.registry.select(cfg));
      assert.equal(lib.status, http.status);
      assert.equal(lib.code, http.code);
      // The same path, rule and value (the HTTP schema's issues join the value with "; got",
      // as tests/core/cache_spec_test.ts checks for the cache-spec fields).
      const rule = ruleText(SPEC_SIZE_RULE);
      assert.deepEqual(lib.issues, [{ path: ["head_size"], message: `${rule}, got ${head_size}` }]);
      assert.deepEqual(http.problem.issues, [{
        path: ["head_size"],
        message: `${rule}; got ${head_size}`,
      }], `head_size ${head_size}`);
    }
    for (const head_size of [1, 2 ** 31 - 1]) {
      assert.equal(
        (await srv.client.select({ head_size, dtype: "float32" })).backend,
        "CPU_REFERENCE",
      );
    }
  } finally {
    await srv.close();
  }
});
