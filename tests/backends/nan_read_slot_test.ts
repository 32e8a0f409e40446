/**
 * A NaN stored in a cache slot a call reads (imported bytes: `PUT .../data`, inline caches) comes
 * out as NaN, as CPU_REFERENCE and float64 give it, in the heads that see the slot, and nowhere
 * else. Before the fix the GPU kernels' last step took a NaN softmax denominator for "no key
 * visible" and answered 0 (LSE -inf): a plausible number for corrupt data. Through WEBGPU_DECODE
 * (one pass and split rows) and WEBGPU_FLASH (decode and prefill rows, the split-KV kernels and the
 * portable tiles), a NaN in K or in V, over f16, bf16, f32 and fp8 e4m3 caches, NHD and HND, with
 * a soft cap too (its clamp() made a NaN +-15).
 *
 * The tensor-core kernel (Dawn with subgroup matrices; skipped with the reason elsewhere) stages
 * bf16 K/V into f16 tiles: NaN, +Infinity and -Infinity read from a bf16 cache come out as
 * float64 gives them (a bare clamp to f16's range made an infinity +-65504 and left a NaN
 * implementation-defined), through the word stores of the first tile, of a later tile and of
 * the request's last, partial tile, early and late stores, both softmax forms; and from an f16
 * cache through matrix staging and direct loads (bit copies). WEBGPU_FLASH's bf16 prefill cases
 * reach that kernel on Dawn and the split-KV kernels elsewhere.
 */
import assert from "node:assert/strict";
import { DEFAULT_DECODE_TUNING, makeWebGpuDecode } from "../../backends/webgpu_decode.ts";
import { makeWebGpuFlash, WEBGPU_FLASH } from "../../backends/webgpu_flash.ts";
import { resolveStorage } from "../../core/dtype.ts";
import type { AttentionBackend, StorageDType } from "../../core/types.ts";
import {
  type BatchSpec,
  cacheIndex,
  generateBatch,
  type GeneratedBatch,
  type RequestSpec,
  smallSpec,
} from "../support/batches.ts";
import { backendRunner, checkNonFinite, type Runner } from "../support/nonfinite.ts";
import { freshSeed, NO_GPU } from "../gpu/helpers.ts";
import { planFlashMma } from "../../backends/flash_mma_plan.ts";
import { MMA_VARIANTS, type MmaShape } from "../../gpu/flash_mma_shape.ts";
import { runGpuPlan } from "../../gpu/gpu_plan.ts";
import { mmaTestDevice, mmaTolerance } from "../support/mma_case.ts";

/** Writes `x` (NaN or an infinity) of `storage` over element `i` of a cache's bytes. */
function poison(bytes: Uint8Array, storage: StorageDType, i: number, x = NaN): void {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const nan = Number.isNaN(x), neg = x < 0;
  assert.ok(nan || x === Infinity || x === -Infinity, `${x} is NaN or an infinity`);
  if (storage === "float32") dv.setFloat32(4 * i, x, true);
  else if (storage === "float16") dv.setUint16(2 * i, nan ? 0x7e00 : neg ? 0xfc00 : 0x7c00, true);
  else if (storage === "bfloat16") dv.setUint16(2 * i, nan ? 0x7fc0 : neg ? 0xff80 : 0x7f80, true);
  else if (nan) bytes[i] = 0x7f; // fp8 e4m3's NaN (e5m2: an f16's high byte, also NaN)
  else {
    assert.equal(storage, "fp8_e5m2", "fp8 e4m3 has no infinity");
    bytes[i] = neg ? 0xfc : 0x7c;
  }
}

/** A context position of one request to plant a value at (kv head 0, element `dim`). */
interface Plant {
  req: number;
  pos: number;
  dim: number;
}

/** Element offset of `p`'s slot in `g`'s cache; asserts the call only reads that slot. */
function plantIndex(g: GeneratedBatch, p: Plant): number {
  const cs = g.cache_spec!, md = g.batch.metadata;
  const r = g.spec.requests[p.req];
  assert.ok(p.pos < r.seq_len - r.query_len, `position ${p.pos} is context of request ${p.req}`);
  const maxBlocks = md.block_table.length / md.num_reqs;
  const block = md.block_table[p.req * maxBlocks + Math.floor(p.pos / cs.block_size)];
  const off = p.pos % cs.block_size;
  assert.ok(!g.written_slots.includes(block * cs.block_size + off), "a slot the call only reads");
  return cacheIndex(cs.layout, cs.block_size, cs.num_kv_heads, cs.head_size, block, off, 0) +
    p.dim;
}

/**
 * Plants `x` in K or V at `plants` of a fresh batch of `spec`, runs it through `runner` and
 * checks the output (and LSE) against CPU_REFERENCE's: non-finite where and as float64 gives
 * it, and finite elsewhere.
 */
async function checkPlanted(
  spec: BatchSpec,
  which: "key" | "value",
  x: number,
  plants: Plant[],
  runner: Runner,
  name: string,
): Promise<void> {
  const seed = freshSeed();
  const g = generateBatch(spec, seed);
  const cs = g.cache_spec!;
  const storage = resolveStorage(cs.kv_cache_dtype, cs.dtype);
  for (const p of plants) {
    poison(which === "key" ? g.key_cache : g.value_cache, storage, plantIndex(g, p), x);
  }
  const label = `${name}, ${x} in ${which}, seed ${seed}`;
  const { odd, total } = await checkNonFinite(g, runner, label);
  assert.ok(odd > 0, `the reference has non-finite outputs (${label})`);
  assert.ok(odd < total, `and finite ones (${label})`);
}

const SPLIT = { target_workgroups: 4096, wave_workgroups: 528, min_split_keys: 16 };
const DECODE = makeWebGpuDecode(DEFAULT_DECODE_TUNING) as AttentionBackend;
const DECODE_SPLIT = makeWebGpuDecode({ ...DEFAULT_DECODE_TUNING, ...SPLIT }) as AttentionBackend;
/** The portable tile kernel for prefill rows (not the split-KV kernels software adapters use). */
const FLASH_TILES = makeWebGpuFlash({
  tile: null,
  decode: { ...DEFAULT_DECODE_TUNING },
  mma: false,
  prefill_split: false,
}) as AttentionBackend;
const DECODE_ROWS = [{ query_len: 1, seq_len: 70 }, { query_len: 1, seq_len: 33 }];

const CASES: [string, AttentionBackend, BatchSpec][] = [
  ["WEBGPU_DECODE, f16 NHD", DECODE, smallSpec({ requests: DECODE_ROWS })],
  [
    "WEBGPU_DECODE split, bf16 HND, sinks",
    DECODE_SPLIT,
    smallSpec({
      dtype: "bfloat16",
      kv_cache_dtype: "bfloat16",
      layout: "HND",
      sinks: true,
      requests: DECODE_ROWS,
    }),
  ],
  [
    "WEBGPU_DECODE split, fp8 e4m3, soft cap",
    DECODE_SPLIT,
    smallSpec({
      kv_cache_dtype: "fp8_e4m3",
      logits_soft_cap: 5,
      requests: DECODE_ROWS,
    }),
  ],
  [
    "WEBGPU_FLASH, f32 decode and prefill rows",
    WEBGPU_FLASH,
    smallSpec({
      dtype: "float32",
      requests: [{ query_len: 1, seq_len: 40 }, { query_len: 6, seq_len: 30 }],
    }),
  ],
  [
    "WEBGPU_FLASH, f16 prefill rows, ALiBi",
    WEBGPU_FLASH,
    smallSpec({
      alibi: true,
      requests: [{ query_len: 9, seq_len: 20 }, { query_len: 4, seq_len: 4 }],
    }),
  ],
  [
    "WEBGPU_FLASH, f16 prefill rows, soft cap",
    WEBGPU_FLASH,
    smallSpec({
      logits_soft_cap: 4,
      requests: [{ query_len: 9, seq_len: 20 }, { query_len: 4, seq_len: 4 }],
    }),
  ],
  [
    "WEBGPU_FLASH tile kernel, f32 prefill rows, soft cap, sinks",
    FLASH_TILES,
    smallSpec({
      dtype: "float32",
      logits_soft_cap: 4,
      sinks: true,
      requests: [{ query_len: 9, seq_len: 20 }, { query_len: 4, seq_len: 4 }],
    }),
  ],
];

/** Request 0's first context position (every query of it sees position 0), element 3. */
const FIRST: Plant[] = [{ req: 0, pos: 0, dim: 3 }];

for (const [name, backend, spec] of CASES) {
  for (const which of ["key", "value"] as const) {
    Deno.test(`NaN in a read ${which} slot comes out NaN: ${name}`, {
      ignore: NO_GPU,
    }, () => checkPlanted(spec, which, NaN, FIRST, backendRunner(backend, spec), name));
  }
}

const VALUES: [string, number][] = [["NaN", NaN], ["+Infinity", Infinity], [
  "-Infinity",
  -Infinity,
]];

/**
 * Three requests, one planted position each: the first key tile (the prologue's stores), a
 * later one (the loop's), and the request's last, partial tile (150 keys: 16- and 32-key tiles
 * end partial; position 144 is its last context position). No ALiBi, window or soft cap: the
 * planted key keeps a weight f16 holds, so an infinite V gives an infinite output, not 0 * inf.
 */
const THREE_TILES: RequestSpec[] = [
  { query_len: 20, seq_len: 150 },
  { query_len: 9, seq_len: 75 },
  { query_len: 5, seq_len: 150 },
];
const THREE_PLANTS: Plant[] = [
  { req: 0, pos: 0, dim: 3 },
  { req: 1, pos: 40, dim: 17 },
  { req: 2, pos: 144, dim: 60 },
];

/** bf16 prefill through WEBGPU_FLASH: the tensor cores on Dawn, the split-KV kernels elsewhere. */
const FLASH_BF16: [string, BatchSpec][] = [
  [
    "WEBGPU_FLASH, bf16 NHD prefill rows",
    smallSpec({ dtype: "bfloat16", kv_cache_dtype: "bfloat16", requests: THREE_TILES }),
  ],
  [
    "WEBGPU_FLASH, f16 data over a bf16 HND cache, sinks",
    smallSpec({ kv_cache_dtype: "bfloat16", layout: "HND", sinks: true, requests: THREE_TILES }),
  ],
];

for (const [name, spec] of FLASH_BF16) {
  for (const [what, x] of VALUES) {
    for (const which of ["key", "value"] as const) {
      Deno.test(`${what} in a read ${which} slot comes out as float64 gives it: ${name}`, {
        ignore: NO_GPU,
      }, () => checkPlanted(spec, which, x, THREE_PLANTS, backendRunner(WEBGPU_FLASH, spec), name));
    }
  }
}

// The tensor-core kernel itself, planned alone (backends/flash_mma_plan.ts) on the Dawn
// subgroup-matrix device: every staging form.
const MMA = await mmaTestDevice("nan_read_slot tensor-core cases");

const MMA_CASES: [string, BatchSpec, MmaShape | undefined][] = [
  [
    "bf16 NHD cache, bf16 data, default shape (late stores, fast softmax)",
    smallSpec({ dtype: "bfloat16", kv_cache_dtype: "bfloat16", requests: THREE_TILES }),
    undefined,
  ],
  [
    "bf16 HND cache, f16 data, sinks, early stores, generic softmax (tau 0)",
    smallSpec({ kv_cache_dtype: "bfloat16", layout: "HND", sinks: true, requests: THREE_TILES }),
    { nsg: 2, rm: 1, bk: 16, tau: 0 },
  ],
  [
    "bf16 NHD cache, bf16 data, 32-key tiles",
    smallSpec({ dtype: "bfloat16", kv_cache_dtype: "bfloat16", requests: THREE_TILES }),
    { nsg: 2, rm: 1, bk: 32, tau: 8, fast: true },
  ],
  [
    "f16 cache, matrix staging",
    smallSpec({ requests: THREE_TILES }),
    MMA_VARIANTS["w4r1k32-fx"],
  ],
  ["f16 cache, direct loads", smallSpec({ requests: THREE_TILES }), MMA_VARIANTS["w8r1k16-fd"]],
];

for (const [name, spec, shape] of MMA_CASES) {
  const runner: Runner | null = MMA && {
    ctx: MMA,
    run: async (batch) => {
      const plan = await planFlashMma(MMA, batch, MMA.mma, shape);
      assert.ok(plan.kernels.some((k) => k.startsWith("flash_mma(")), `planned ${plan.kernels}`);
      return await runGpuPlan(plan, batch, MMA);
    },
    tol: mmaTolerance(spec),
    lseTol: { atol: 1e-3, rtol: 1e-4 },
  };
  for (const [what, x] of VALUES) {
    for (const which of ["key", "value"] as const) {
      Deno.test({
        name: `${what} in a read ${which} slot comes out as float64 gives it: flash_mma, ${name}`,
        ignore: runner === null,
        sanitizeOps: false,
        sanitizeResources: false,
        fn: () => checkPlanted(spec, which, x, THREE_PLANTS, runner!, `flash_mma, ${name}`),
      });
    }
  }
}
