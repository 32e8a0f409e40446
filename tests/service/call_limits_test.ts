/**
 * The per-call FLOPs limit (service/call_limits.ts): 4 x attended keys x num_heads x head_size,
 * counted and compared exactly (BigInt) on either side of 2^53, refused as 422 `limit_exceeded`
 * naming the limit, the count and the max, alone or listed with the other limits.
 */
import assert from "node:assert/strict";
import type { ServiceError } from "../../core/errors.ts";
import { attentionFlops, type CallCounts, limitsOver } from "../../service/call_limits.ts";
import { validateForward } from "../../service/validate.ts";
import { DECODE_HELD, decodeInput, ints, refused422 } from "./decode_input.ts";

const HELD = DECODE_HELD;
const decode = () => decodeInput();

const issueLines = (e: ServiceError) => e.issues!.map((i) => `${i.path.join(".")}: ${i.message}`);

Deno.test("flops limit: at the max a call runs; one FLOP under its count it is refused", () => {
  // The keys limit lets the call through (10 <= 10): the FLOPs limit alone decides.
  const limits = { max_tokens: 1, max_attended_keys: 10 };
  validateForward(decode(), HELD, { ...limits, max_attention_flops: 320 });
  const e = refused422(
    () => validateForward(decode(), HELD, { ...limits, max_attention_flops: 319 }),
    "limit_exceeded",
  );
  assert.equal(
    e.message,
    "attention FLOPs 320 (4 x 10 attended keys x 2 heads x head_size 4) exceeds the per-call " +
      "limit max_attention_flops = 319",
  );
  assert.deepEqual(e.extra, { limit: "max_attention_flops", value: 320, max: 319 });
  assert.deepEqual(issueLines(e), [
    "metadata.seq_lens: attention FLOPs 320 (4 x 10 attended keys x 2 heads x head_size 4) " +
    "exceeds max_attention_flops = 319",
  ]);
});

Deno.test("flops limit: one key more on the same layer is one FLOP unit (4 x H x D) over", () => {
  const c: CallCounts = { num_tokens: 1, attended_keys: 10, num_heads: 2, head_size: 4 };
  assert.deepEqual(limitsOver(c, { max_attention_flops: 320 }), []);
  const over = limitsOver({ ...c, attended_keys: 11 }, { max_attention_flops: 320 });
  assert.deepEqual(over.map((o) => [o.limit, o.value, o.max]), [["max_attention_flops", 352, 320]]);
  // The same keys on a layer 64x wider (32 heads of 256 against 4 of 32): 64x the FLOPs.
  const narrow = attentionFlops(1000, 4, 32), wide = attentionFlops(1000, 32, 256);
  assert.equal(wide, 64n * narrow);
});

Deno.test("flops limit: exact past 2^53 (BigInt), the message has every digit", () => {
  // 4 x (2^51 - 1) = 2^53 - 4: under the largest max (2^53 - 1), at 2^53 - 4, over 2^53 - 5.
  const c: CallCounts = { num_tokens: 1, attended_keys: 2 ** 51 - 1, num_heads: 1, head_size: 1 };
  assert.deepEqual(limitsOver(c, { max_attended_keys: 2 ** 52 }), []);
  assert.deepEqual(
    limitsOver(c, { max_attended_keys: 2 ** 52, max_attention_flops: 2 ** 53 - 4 }),
    [],
  );
  const o = limitsOver(c, { max_attended_keys: 2 ** 52, max_attention_flops: 2 ** 53 - 5 });
  assert.deepEqual(o.map((x) => [x.limit, x.value, x.max]), [
    ["max_attention_flops", 2 ** 53 - 4, 2 ** 53 - 5],
  ]);
  // 12 x (2^52 + 1) = 54043195528445964; a float product is 54043195528445968 (written ...970).
  const c2 = { num_tokens: 1, attended_keys: 2 ** 52 + 1, num_heads: 3, head_size: 1 };
  const big = limitsOver(c2, { max_attended_keys: 2 ** 53 - 1 });
  assert.equal(attentionFlops(2 ** 52 + 1, 3, 1), 54043195528445964n);
  assert.equal(big.length, 1);
  assert.equal(big[0].limit, "max_attention_flops");
  assert.equal(big[0].max, Number.MAX_SAFE_INTEGER, "the default");
  assert.equal(big[0].count.split(" ")[0], "54043195528445964");
  assert.ok(big[0].value > big[0].max);
});

Deno.test("flops limit: listed after the other limits; with a rule broken, in invalid_batch", () => {
  const limits = { max_tokens: 0, max_attended_keys: 9, max_attention_flops: 100 };
  const e = refused422(() => validateForward(decode(), HELD, limits), "limit_exceeded");
  assert.deepEqual(e.issues!.map((i) => i.message.split(" exceeds ")[1]), [
    "max_tokens = 0",
    "max_attended_keys = 9",
    "max_attention_flops = 100",
  ]);
  assert.deepEqual(e.extra, { limit: "max_tokens", value: 1, max: 0 });
  const bad = decode();
  bad.metadata = { ...bad.metadata, slot_mapping: ints([99]) };
  const only = { max_attention_flops: 100 };
  const b = refused422(() => validateForward(bad, HELD, only), "invalid_batch");
  assert.deepEqual(b.issues!.map((i) => i.path.join(".")), [
    "metadata.slot_mapping.0",
    "metadata.seq_lens",
  ]);
  assert.deepEqual(b.extra, { limit: "max_attention_flops", value: 320, max: 100 });
  // seq_lens broken: no key count, so no FLOPs count either.
  const noCount = decode();
  noCount.metadata = { ...noCount.metadata, seq_lens: ints([-1]) };
  const n = refused422(() => validateForward(noCount, HELD, only), "invalid_batch");
  assert.deepEqual(n.issues!.map((i) => i.path.join(".")), ["metadata.seq_lens.0"]);
  assert.equal(n.extra, undefined);
});

Deno.test("flops limit: a library caller's non-integer layer or limit is checked, not a RangeError", () => {
  // The HTTP schema and flags take integers only; a library caller's layer or limits may not
  // be. A broken layer is the 422 invalid_batch it was before the FLOPs limit (BigInt() of
  // 2.5 threw), and a limit compares as the other limits do: Infinity is none, 320.5 lets 320.
  for (const layer of [{ num_heads: 2.5 }, { head_size: 4.5 }]) {
    const bad = decode();
    bad.layer = { ...bad.layer, ...layer };
    refused422(() => validateForward(bad, HELD), "invalid_batch");
  }
  validateForward(decode(), HELD, { max_attention_flops: Infinity });
  validateForward(decode(), HELD, { max_attention_flops: 320.5 });
  const e = refused422(
    () => validateForward(decode(), HELD, { max_attention_flops: 319.5 }),
    "limit_exceeded",
  );
  assert.deepEqual(e.extra, { limit: "max_attention_flops", value: 320, max: 319.5 });
});
