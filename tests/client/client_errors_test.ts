/**
 * Every failure of a client call is an AttentionApiError with a code, as the README says: a
 * successful answer whose body cannot be read as the route's answer (`bad_response`, the
 * answer's status) and a call that got no answer or lost it mid-body (`network_error`, status
 * 0), each with the original error as `cause`. A caller's own abort stays the AbortError.
 */
import assert from "node:assert/strict";
import { AttentionApiError, AttentionClient } from "../../client/client.ts";

const ID = "cache-1";

function clientAnswering(res: () => Response | Promise<Response>): AttentionClient {
  return new AttentionClient("http://x", { fetch: () => Promise.resolve(res()) });
}

function isApiError(code: string, status: number, cause: (e: unknown) => boolean) {
  return (e: unknown) => {
    assert.ok(e instanceof AttentionApiError, `expected an AttentionApiError, got ${e}`);
    assert.equal(e.code, code);
    assert.equal(e.status, status);
    assert.equal(e.problem.status, status);
    assert.equal(typeof e.problem.detail, "string");
    assert.ok(cause(e.cause), `cause: ${e.cause}`);
    return true;
  };
}

Deno.test("client: a 200 whose body is not the answer is bad_response, the parse error its cause", async () => {
  const html = () =>
    new Response("<html>hello from a proxy</html>", {
      status: 200,
      headers: { "content-type": "text/html", "x-attention-instance": "gpu-3" },
    });
  const c = clientAnswering(html);
  const syntax = (x: unknown) => x instanceof SyntaxError;
  for (
    const call of [
      () => c.health(),
      () => c.backends(),
      () => c.getCache(ID),
      () =>
        c.putCache(ID, {
          num_blocks: 1,
          block_size: 16,
          num_kv_heads: 1,
          head_size: 4,
          dtype: "float32",
        }),
    ]
  ) await assert.rejects(call, isApiError("bad_response", 200, syntax));
  const e = await c.health().then(() => null, (x) => x);
  assert.equal(e.instance, "gpu-3");
  assert.match(e.message, /^200 bad_response: /);
  // A binary answer that is no safetensors file is one too.
  const bin = clientAnswering(() => new Response(new Uint8Array([1, 2, 3]), { status: 200 }));
  await assert.rejects(() => bin.cacheData(ID), isApiError("bad_response", 200, (x) => !!x));
});

Deno.test("client: no answer, or one cut short, is network_error, the fetch error its cause", async () => {
  const refused = new TypeError("error sending request: connection refused");
  const c = new AttentionClient("http://x", { fetch: () => Promise.reject(refused) });
  await assert.rejects(() => c.health(), isApiError("network_error", 0, (x) => x === refused));
  await assert.rejects(
    () => c.deleteCache(ID),
    isApiError("network_error", 0, (x) => x === refused),
  );
  // The body breaks off after the head came.
  const cut = new TypeError("error reading a body from connection");
  const broken = () =>
    new Response(
      new ReadableStream({
        start(ctl) {
          ctl.enqueue(new TextEncoder().encode('{"status":'));
          ctl.error(cut);
        },
      }),
      { status: 200, headers: { "content-type": "application/json" } },
    );
  await assert.rejects(
    () => clientAnswering(broken).health(),
    isApiError("network_error", 0, (x) => x === cut),
  );
  // An error answer whose body breaks off too.
  const broken503 = () =>
    new Response(new ReadableStream({ start: (ctl) => ctl.error(cut) }), { status: 503 });
  await assert.rejects(
    () => clientAnswering(broken503).health(),
    isApiError("network_error", 0, (x) => x === cut),
  );
});

Deno.test("client: the caller's abort is still the abort, not wrapped", async () => {
  const ac = new AbortController();
  const reason = new DOMException("stop", "AbortError");
  const c = new AttentionClient("http://x", {
    fetch: (_u, init) => {
      ac.abort(reason);
      return Promise.reject(init?.signal?.reason);
    },
  });
  const body = {} as Parameters<AttentionClient["forward"]>[0];
  await assert.rejects(() => c.forward(body, { signal: ac.signal }), (e) => e === reason);
});
