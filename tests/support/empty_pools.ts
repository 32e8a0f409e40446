/** Memory pools with every count zero, for /metrics texts built from given values in tests. */
import type { MemoryPools } from "../../server/metrics.ts";

export const EMPTY_POOLS: MemoryPools = {
  gpu: { free_bytes: 0, in_use_bytes: 0, max_free_bytes: 0, created: 0, reused: 0 },
  host: { free_bytes: 0, in_use_bytes: 0, max_free_bytes: 0, created: 0, reused: 0, leaked: 0 },
  readbacks: { early: 0, awaited: 0, deferred: 0, by_submit: 0 },
};
