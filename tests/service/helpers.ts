/**
 * A scriptable host backend for service tests: counts calls, can hold `run` on a gate, records
 * which runs overlapped, and lets a test mark its caches lost.
 * @module
 */
import { fromFloats } from "../../core/data.ts";
import type {
  AttentionBackend,
  Capabilities,
  KvCache,
  KvCacheSpec,
  PlanContract,
  ValidBatch,
} from "../../core/types.ts";
import { cacheBytes } from "../../service/cache_store.ts";
import type { ForwardInput } from "../../service/validate.ts";

/** A host cache the fake backend hands out. */
export class FakeCache implements KvCache {
  readonly storage = "host" as const;
  readonly bytes: number;
  key: Uint8Array;
  value: Uint8Array;
  lost = false;
  destroyed = false;
  constructor(readonly spec: KvCacheSpec, key?: Uint8Array, value?: Uint8Array) {
    this.bytes = cacheBytes(spec);
    this.key = key ?? new Uint8Array(this.bytes / 2);
    this.value = value ?? new Uint8Array(this.bytes / 2);
  }
  read() {
    return Promise.resolve({ key: this.key.slice(), value: this.value.slice() });
  }
  destroy() {
    this.destroyed = true;
  }
}

/** Permissive capabilities. */
export const ANY_CAPS: Capabilities = {
  dtypes: ["float32", "float16", "bfloat16"],
  kv_cache_dtypes: ["auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"],
  block_sizes: [],
  head_sizes: [],
  kv_cache_layouts: ["NHD", "HND"],
  attn_types: ["decoder", "encoder", "encoder_only", "encoder_decoder"],
  is_mla: false,
  sinks: true,
  sliding_window: true,
  alibi: true,
  logits_soft_cap: true,
  non_causal: true,
  sparse: false,
  mm_prefix: false,
  per_head_quant_scales: false,
  batch_invariant: false,
  kv_connector: false,
  lse: true,
  graph_support: "NEVER",
  reorder_batch_threshold: null,
};

/** The fake backend and its instrumentation. */
export interface FakeBackend extends AttentionBackend<PlanContract> {
  plans: number;
  runs: number;
  /** Runs in flight now, and the most seen at once. */
  active: number;
  maxActive: number;
  created: FakeCache[];
  imported: FakeCache[];
  /** When set, `run` waits for it. */
  gate: Promise<void> | null;
  /** Resolves each time a run starts. */
  onRunStart: (() => void) | null;
  /**
   * When set, `run` writes the cache and calls `onSubmitted` before it waits for `gate` (a GPU
   * backend's submit, then its read-back); otherwise it waits first and never calls it.
   */
  submitsEarly: boolean;
}

/** A fake host backend (priority 0: preferred). Its run writes 1 into the first K byte of each slot. */
export function fakeBackend(name = "FAKE"): FakeBackend {
  const b: FakeBackend = {
    name,
    priority: 0,
    description: "test double",
    capabilities: ANY_CAPS,
    requires: { needs_device: false, features: [], limits: {} },
    cache_storage: "host",
    plans: 0,
    runs: 0,
    active: 0,
    maxActive: 0,
    created: [],
    imported: [],
    gate: null,
    onRunStart: null,
    submitsEarly: false,
    createCache(spec) {
      const c = new FakeCache(spec);
      b.created.push(c);
      return c;
    },
    importCache(spec, k, v) {
      const c = new FakeCache(spec, k, v);
      b.imported.push(c);
      return c;
    },
    plan() {
      b.plans++;
      return {};
    },
    async run(_p, batch: ValidBatch, _ctx, opts = {}) {
      b.runs++;
      b.active++;
      b.maxActive = Math.max(b.maxActive, b.active);
      b.onRunStart?.();
      const write = () => {
        const c = batch.cache as FakeCache | null;
        if (!c) return;
        const per = c.bytes / 2 / (c.spec.num_blocks * c.spec.block_size);
        for (const s of batch.metadata.slot_mapping) if (s >= 0) c.key[s * per] += 1;
      };
      try {
        if (b.submitsEarly) {
          write();
          opts.onSubmitted?.();
          if (b.gate) await b.gate;
        } else {
          if (b.gate) await b.gate;
          write();
        }
        const n = batch.num_tokens * batch.layer.num_heads * batch.layer.head_size;
        return {
          output: fromFloats(batch.dtype, new Float32Array(n).fill(0.5)),
          lse: batch.return_lse ? new Float32Array(0) : null,
        };
      } finally {
        b.active--;
      }
    },
  };
  return b;
}

/** A promise with its resolver. */
export function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/** A float32 tensor of `shape` filled with 0.1. */
export const f32Tensor = (shape: number[]) => ({
  dtype: "float32" as const,
  shape,
  array: fromFloats("float32", new Float32Array(shape.reduce((a, b) => a * b, 1)).fill(0.1)),
  encoding: "data" as const,
});

/** An int32 metadata tensor. */
export const intTensor = (v: number[], shape = [v.length]) => ({
  shape,
  values: Int32Array.from(v),
});

/** A one-token decode step (2 q / 1 kv heads, head 4) on cache `kv_cache`, writing `slot`. */
export function decodeInput(kv_cache: string, slot = 5): ForwardInput {
  return {
    dtype: "float32",
    layer: { num_heads: 2, num_kv_heads: 1, head_size: 4 },
    query: f32Tensor([1, 2, 4]),
    key: f32Tensor([1, 1, 4]),
    value: f32Tensor([1, 1, 4]),
    metadata: {
      query_start_loc: intTensor([0, 1]),
      seq_lens: intTensor([2]),
      block_table: intTensor([1], [1, 1]),
      slot_mapping: intTensor([slot]),
    },
    kv_cache,
  };
}
