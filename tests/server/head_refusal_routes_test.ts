/**
 * server/head_refusal.ts names the routes that read a body (to skip reading one they refuse by
 * its head): the same set as the handler's POST and PUT routes, so a route added to one and not
 * the other fails here instead of having its bodies read for nothing (or checked by another
 * route's kinds).
 * @module
 */
import assert from "node:assert/strict";
import { BODY_ROUTES } from "../../server/head_refusal.ts";
import { createHandler } from "../../server/handler.ts";
import { AttentionService } from "../../service/service.ts";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import type { AttentionBackend } from "../../core/types.ts";
import { FakeNoDevice } from "./helpers.ts";

Deno.test("head refusal: its body routes are the handler's POST and PUT routes", async () => {
  const service = new AttentionService({
    backends: [CPU_REFERENCE as AttentionBackend],
    device: new FakeNoDevice(),
    memoryBudgetBytes: 1 << 20,
  });
  try {
    const handler = createHandler(service, {});
    const bodyRoutes = (rs: readonly { method: string; path: string }[]) =>
      rs.filter((r) => r.method === "POST" || r.method === "PUT").map((r) =>
        `${r.method} ${r.path}`
      ).sort();
    assert.deepEqual(bodyRoutes(BODY_ROUTES), bodyRoutes(handler.routes));
  } finally {
    await service.close();
  }
});
