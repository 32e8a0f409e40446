/**
 * The registry and selector: priority order, rejected reasons, forced selection (valid,
 * invalid 422, unknown 404), no valid backend, the selection cache and its invalidation on a
 * device change, describe() and the selector defaults. Fake descriptors and fake GPU contexts.
 * @module
 */
import assert from "node:assert/strict";
import {
  BackendRegistry,
  SELECTION_CACHE_LIMIT,
  selectorConfigDefaults,
} from "../../backends/registry.ts";
import { builtinBackends } from "../../backends/index.ts";
import { capabilities } from "../../backends/capabilities_base.ts";
import { NoValidBackendError, ServiceError } from "../../core/errors.ts";
import type {
  AttentionBackend,
  Capabilities,
  DeviceRequirements,
  GpuContext,
  SelectorConfig,
} from "../../core/types.ts";

const CAPS: Capabilities = capabilities({
  dtypes: ["float32", "float16"],
  kv_cache_dtypes: ["auto", "float16"],
  kv_cache_layouts: ["NHD"],
  attn_types: ["decoder"],
});

const HOST: DeviceRequirements = { needs_device: false, features: [], limits: {} };
const F16: DeviceRequirements = { needs_device: true, features: ["shader-f16"], limits: {} };

/** A descriptor that counts how often it was validated (through supportsCombination). */
interface Counted extends AttentionBackend {
  checks: number;
}

function fake(
  name: string,
  priority: number,
  caps: Partial<Capabilities> = {},
  requires: DeviceRequirements = HOST,
): Counted {
  const fail = () => {
    throw new Error("not used");
  };
  const b: Counted = {
    name,
    priority,
    description: `${name} fake`,
    capabilities: { ...CAPS, ...caps },
    requires,
    cache_storage: requires.needs_device ? "webgpu" : "host",
    checks: 0,
    supportsCombination() {
      b.checks++;
      return null;
    },
    createCache: fail,
    importCache: fail,
    plan: fail,
    run: fail,
  };
  return b;
}

function gpu(generation: number, features: string[] = ["shader-f16"], lost = false): GpuContext {
  return {
    device: {} as GPUDevice,
    adapter_info: { vendor: "fake", architecture: "", device: "", description: "" },
    features: new Set(features),
    limits: {},
    generation,
    lost,
  } as GpuContext;
}

const cfg = (over: Partial<SelectorConfig> = {}) =>
  selectorConfigDefaults({ head_size: 64, dtype: "float32", ...over });

/** FAST (GPU, priority 0, sinks, MultipleOf 32), SLOW (GPU, 10), REF (host, 100, anything). */
function setup(device: GpuContext | null = gpu(1)) {
  const fast = fake("FAST", 0, { sinks: true, block_sizes: [{ multiple_of: 32 }] }, F16);
  const slow = fake("SLOW", 10, { dtypes: ["float32"], block_sizes: [16, 32] }, {
    needs_device: true,
    features: [],
    limits: {},
  });
  const ref = fake("REF", 100, {
    dtypes: ["float32", "float16", "bfloat16"],
    sliding_window: true,
  });
  const state = { device };
  const reg = new BackendRegistry([ref, slow, fast], () => state.device);
  return { reg, fast, slow, ref, state };
}

function catchErr(f: () => unknown): ServiceError {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof ServiceError, `expected a ServiceError, got ${e}`);
    return e;
  }
  assert.fail("expected a throw");
}

Deno.test("list: by priority, then name; duplicates rejected", () => {
  const a = fake("B_TIE", 5), b = fake("A_TIE", 5), c = fake("FIRST", 1);
  const reg = new BackendRegistry([a, b, c], () => null);
  assert.deepEqual(reg.list().map((x) => x.name), ["FIRST", "A_TIE", "B_TIE"]);
  assert.equal(reg.get("A_TIE"), b);
  assert.throws(() => new BackendRegistry([a, fake("B_TIE", 9)], () => null), /duplicate/);
});

Deno.test("auto selection: first valid by priority, rejected holds those passed over", async (t) => {
  await t.step("the highest priority valid backend wins, with its preferred block size", () => {
    const { reg, fast } = setup();
    const r = reg.select(cfg());
    assert.equal(r.backend, fast);
    assert.equal(r.block_size, 32);
    assert.deepEqual(r.rejected, {});
  });
  await t.step("a given block size is kept; skipped backends explain themselves", () => {
    const { reg, slow } = setup();
    const r = reg.select(cfg({ block_size: 48 }));
    assert.equal(r.backend, slow);
    assert.equal(r.block_size, 48);
    assert.deepEqual(r.rejected, {
      FAST: ["block_size not supported (got 48; supported: multiple of 32)"],
    });
  });
  await t.step("backends after the winner are not listed", () => {
    const { reg, ref } = setup();
    const r = reg.select(cfg({ has_sliding_window: true, block_size: 64 }));
    assert.equal(r.backend, ref);
    assert.equal(r.block_size, 64);
    assert.deepEqual(Object.keys(r.rejected), ["FAST", "SLOW"]);
    assert.deepEqual(r.rejected.SLOW, ["sliding window not supported"]);
  });
  await t.step("no device: GPU backends rejected with the device reason", () => {
    const { reg, ref } = setup(null);
    const r = reg.select(cfg());
    assert.equal(r.backend, ref);
    assert.equal(r.block_size, 16);
    assert.deepEqual(r.rejected, {
      FAST: ["compute capability not supported: no WebGPU adapter"],
      SLOW: ["compute capability not supported: no WebGPU adapter"],
    });
  });
  await t.step("a device without shader-f16 skips FAST", () => {
    const { reg, slow } = setup(gpu(1, []));
    const r = reg.select(cfg());
    assert.equal(r.backend, slow);
    assert.equal(r.block_size, 16);
    assert.deepEqual(r.rejected, {
      FAST: ["compute capability not supported: missing WebGPU feature shader-f16"],
    });
  });
});

Deno.test("no valid backend: 422 with every backend's reasons", () => {
  const { reg } = setup();
  const e = catchErr(() => reg.select(cfg({ dtype: "bfloat16", has_sink: true })));
  assert.ok(e instanceof NoValidBackendError);
  assert.equal(e.status, 422);
  assert.equal(e.code, "no_valid_backend");
  assert.deepEqual(e.reasons, {
    FAST: ["dtype not supported (got bfloat16; supported: float32, float16)"],
    SLOW: [
      "dtype not supported (got bfloat16; supported: float32)",
      "attention sinks not supported",
    ],
    REF: ["attention sinks not supported"],
  });
  assert.match(e.message, /FAST: \[dtype not supported/);
});

Deno.test("forced selection", async (t) => {
  await t.step("a valid forced backend wins even when a better one exists", () => {
    const { reg, ref } = setup();
    const r = reg.select(cfg(), { backend: "REF" });
    assert.equal(r.backend, ref);
    assert.equal(r.block_size, 16);
    assert.deepEqual(r.rejected, {});
  });
  await t.step('"auto" means auto', () => {
    const { reg, fast } = setup();
    assert.equal(reg.select(cfg(), { backend: "auto" }).backend, fast);
  });
  await t.step("an invalid forced backend: 422 with every backend's reasons, its own first", () => {
    // The contract's 422 no_valid_backend has reasons for every backend; a forced one's had
    // only its own (an audit): now the others' too, [] for one that could run it.
    const { reg, fast, ref } = setup();
    const c = cfg({ has_sink: true });
    const e = catchErr(() => reg.select(c, { backend: "SLOW" }));
    assert.ok(e instanceof NoValidBackendError);
    assert.equal(e.status, 422);
    assert.deepEqual(Object.keys(e.reasons!), ["SLOW", "FAST", "REF"]);
    assert.deepEqual(e.reasons!.SLOW, ["attention sinks not supported"]);
    assert.deepEqual(e.reasons!.FAST, reg.validate(fast, c));
    assert.deepEqual(e.reasons!.REF, ["attention sinks not supported"]);
    assert.deepEqual(reg.validate(ref, c), e.reasons!.REF);
    assert.match(e.message, /^backend SLOW cannot run this configuration: \[attention sinks/);
  });
  await t.step("an unknown (or wrongly cased) name: 404 naming it and the known ones", () => {
    const { reg } = setup();
    for (const name of ["NOPE", "fast"]) {
      const e = catchErr(() => reg.select(cfg(), { backend: name }));
      assert.equal(e.status, 404);
      assert.equal(e.code, "unknown_backend");
      assert.ok(e.message.includes(`"${name}"`), e.message);
      assert.ok(e.message.includes("FAST, SLOW, REF"), e.message);
      assert.deepEqual(e.extra, { backend: name, known: ["FAST", "SLOW", "REF"] });
    }
    assert.equal(catchErr(() => reg.get("NOPE")).code, "unknown_backend");
  });
});

Deno.test("selection cache: hits by canonical key, invalidated by a device change", () => {
  const { reg, fast, slow, state } = setup();
  const a = reg.select(cfg({ block_size: 64 }));
  assert.equal(reg.cacheSize(), 1);
  const checks = fast.checks;
  // The same config with keys in another order and an explicit false extension flag: a hit.
  const reordered = { ...cfg({ block_size: 64, return_lse: false }) };
  const shuffled = Object.fromEntries(
    Object.entries(reordered).reverse(),
  ) as unknown as SelectorConfig;
  const b = reg.select(shuffled);
  assert.equal(reg.cacheSize(), 1);
  assert.equal(fast.checks, checks, "a cache hit must not re-validate");
  assert.equal(b.backend, a.backend);
  // Mutating a returned result does not corrupt the cache.
  const c1 = reg.select(cfg({ block_size: 48 }));
  c1.rejected.FAST.push("garbage");
  assert.deepEqual(reg.select(cfg({ block_size: 48 })).rejected.FAST.length, 1);
  // Forced and auto are distinct keys; failures are cached too.
  reg.select(cfg({ block_size: 64 }), { backend: "SLOW" });
  assert.throws(() => reg.select(cfg({ dtype: "bfloat16", has_sink: true })), NoValidBackendError);
  assert.throws(() => reg.select(cfg({ dtype: "bfloat16", has_sink: true })), NoValidBackendError);
  assert.equal(reg.cacheSize(), 4);

  // A re-acquired device without shader-f16: same config, new answer, old entries dropped.
  state.device = gpu(2, []);
  const d = reg.select(cfg({ block_size: 64 }));
  assert.equal(d.backend, slow);
  assert.equal(reg.cacheSize(), 1);
  // Lost (same generation): device backends are rejected with the loss.
  state.device = gpu(2, [], true);
  const e = reg.select(cfg({ block_size: 64 }));
  assert.equal(e.backend.name, "REF");
  assert.deepEqual(e.rejected.SLOW, ["compute capability not supported: device lost"]);
  state.device = null;
  assert.deepEqual(reg.select(cfg({ block_size: 64 })).rejected.SLOW, [
    "compute capability not supported: no WebGPU adapter",
  ]);
  state.device = gpu(3);
  assert.equal(reg.select(cfg({ block_size: 64 })).backend, fast);
});

Deno.test("selection cache is bounded", () => {
  const { reg } = setup();
  for (let i = 1; i <= SELECTION_CACHE_LIMIT + 5; i++) reg.select(cfg({ head_size: i }));
  assert.equal(reg.cacheSize(), SELECTION_CACHE_LIMIT);
});

Deno.test("availability, validate and describe", () => {
  const { reg, fast, slow, ref } = setup(gpu(1, []));
  assert.deepEqual(reg.availability(fast), {
    available: false,
    reasons: ["compute capability not supported: missing WebGPU feature shader-f16"],
  });
  assert.deepEqual(reg.availability(slow), { available: true, reasons: [] });
  assert.deepEqual(reg.validate(ref, cfg({ has_sink: true })), ["attention sinks not supported"]);
  const info = reg.describe();
  assert.deepEqual(info.map((i) => [i.name, i.priority, i.available]), [
    ["FAST", 0, false],
    ["SLOW", 10, true],
    ["REF", 100, true],
  ]);
  assert.deepEqual(info[0].unavailable_reasons, [
    "compute capability not supported: missing WebGPU feature shader-f16",
  ]);
  assert.equal("unavailable_reasons" in info[1], false);
  assert.equal(info[0].description, "FAST fake");
  assert.equal(info[0].cache_storage, "webgpu");
  assert.deepEqual(info[0].requires, F16);
  assert.deepEqual(info[0].capabilities, fast.capabilities);
  assert.deepEqual(info[0].capabilities.block_sizes, [{ multiple_of: 32 }]);
  assert.deepEqual(JSON.parse(JSON.stringify(info[1].capabilities.block_sizes)), [16, 32]);
  info[0].capabilities.dtypes.push("bfloat16");
  assert.deepEqual(fast.capabilities.dtypes, ["float32", "float16"], "describe must copy");
});

Deno.test("selectorConfigDefaults: vLLM's defaults, extensions only when given", () => {
  assert.deepEqual(selectorConfigDefaults({ head_size: 128, dtype: "float16" }), {
    head_size: 128,
    dtype: "float16",
    kv_cache_dtype: "auto",
    block_size: null,
    use_mla: false,
    has_sink: false,
    use_sparse: false,
    use_mm_prefix: false,
    attn_type: "decoder",
    has_sliding_window: false,
    use_non_causal: false,
    use_batch_invariant: false,
    use_per_head_quant_scales: false,
  });
  const c = selectorConfigDefaults({
    head_size: 64,
    dtype: "float32",
    block_size: 32,
    has_sink: true,
    attn_type: "encoder",
    kv_cache_layout: "HND",
    return_lse: true,
    max_query_len: 1,
    backend: "X",
  } as Partial<SelectorConfig>);
  assert.equal(c.block_size, 32);
  assert.equal(c.has_sink, true);
  assert.equal(c.attn_type, "encoder");
  assert.equal(c.kv_cache_layout, "HND");
  assert.equal(c.return_lse, true);
  assert.equal(c.max_query_len, 1);
  assert.equal("backend" in c, false);
  assert.equal("use_alibi" in c, false);
  const e = catchErr(() => selectorConfigDefaults({ dtype: "float32" }));
  assert.equal(e.status, 400);
  assert.deepEqual(e.issues?.map((i) => i.path), [["head_size"]]);
});

Deno.test("select/selectorConfigDefaults: a head_size that is not a positive integer is a 400 naming it", () => {
  const { reg } = setup(null);
  const builtin = new BackendRegistry(builtinBackends(), () => null);
  for (const head_size of [-1, 0, Number.NaN, 2.5, Infinity]) {
    const refused = (e: ServiceError) => {
      assert.equal(e.status, 400, `${head_size}`);
      assert.equal(e.code, "invalid_request");
      assert.deepEqual(e.issues?.map((i) => i.path), [["head_size"]]);
      assert.match(e.message, new RegExp(`head_size .*got ${head_size}`));
      assert.match(e.issues![0].message, new RegExp(`got ${head_size}$`));
    };
    refused(catchErr(() => selectorConfigDefaults({ head_size, dtype: "float32" })));
    // A config built without selectorConfigDefaults is checked by select too, before the cache.
    const raw = { ...cfg(), head_size };
    refused(catchErr(() => reg.select(raw)));
    refused(catchErr(() => builtin.select(raw)));
    refused(catchErr(() => builtin.select(raw, { backend: "CPU_REFERENCE" })));
  }
  assert.equal(reg.cacheSize(), 0, "no refused config is cached");
});

Deno.test("no valid backend: an empty block_sizes list reads as any size in a reason", () => {
  const reg = new BackendRegistry(builtinBackends(), () => null);
  const e = catchErr(() => reg.select(cfg({ block_size: 0 })));
  assert.ok(e instanceof NoValidBackendError);
  const why = e.reasons?.CPU_REFERENCE ?? [];
  assert.deepEqual(why.filter((r) => r.startsWith("block_size")), [
    "block_size not supported (got 0; supported: any positive integer)",
  ]);
  assert.ok(!why.some((r) => /supported: none/.test(r)), why.join("; "));
});
