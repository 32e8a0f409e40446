/**
 * `importCacheData` checks the file against the cache it replaces under that cache's lock: a
 * cache deleted and created again with the same id while the import awaited the device (a lost
 * device being acquired again) may have another spec of the same bytes (NHD against HND), and
 * its bytes must not be read in the wrong layout. Before, the file was checked only against
 * the cache held when the call began, and the import went through (an audit of cache
 * export/import found it by reading the code).
 */
import assert from "node:assert/strict";
import { CPU_REFERENCE } from "../../backends/cpu/cpu_reference.ts";
import { ServiceError } from "../../core/errors.ts";
import type { DeviceProvider, DeviceReport, GpuContext } from "../../core/device_types.ts";
import { AttentionService } from "../../service/service.ts";
import { cacheSafetensors, parseCacheFile } from "../../wire/cache_file.ts";

/** No device, as after a loss: `acquire` is awaited; `hold()` makes the next one wait. */
class LostDevice implements DeviceProvider {
  #release: (() => void) | null = null;
  #hold = false;
  hold(): void {
    this.#hold = true;
  }
  release(): void {
    this.#release?.();
  }
  current(): GpuContext | null {
    return null;
  }
  acquire(): Promise<GpuContext | null> {
    if (!this.#hold) return Promise.resolve(null);
    this.#hold = false;
    return new Promise((r) => this.#release = () => r(null));
  }
  report(): DeviceReport {
    const base = { available: false, runtime: "none", reason: "test", features: [], limits: {} };
    return { ...base, generation: 1 } as DeviceReport;
  }
}

const SPEC = { num_blocks: 2, block_size: 4, num_kv_heads: 4, head_size: 8, dtype: "float32" };

Deno.test("cache import: a cache re-created with another layout while the import waited is not written", async () => {
  const device = new LostDevice();
  const svc = new AttentionService({
    backends: [CPU_REFERENCE],
    device,
    memoryBudgetBytes: 1 << 20,
  });
  await svc.putCache("c", { ...SPEC, layout: "NHD" } as never);
  const nhd = await svc.cacheData("c");
  nhd.key.fill(7);
  const file = parseCacheFile(cacheSafetensors(nhd));

  device.hold();
  const importing = svc.importCacheData("c", file); // checked against NHD, then waits
  await svc.deleteCache("c");
  // block_size 4 and 4 heads: HND's [blocks, heads, block, D] has NHD's shape and bytes.
  await svc.putCache("c", { ...SPEC, layout: "HND" } as never);
  const before = await svc.cacheData("c");
  device.release();

  await assert.rejects(importing, (e: unknown) => {
    assert.ok(e instanceof ServiceError);
    assert.equal(e.status, 422);
    assert.equal(e.code, "cache_data_mismatch");
    return true;
  });
  const after = await svc.cacheData("c");
  assert.deepEqual(after.key, before.key, "the re-created cache's keys are unchanged");
  assert.deepEqual(after.value, before.value);
  assert.equal(svc.getCache("c").layout, "HND");
  await CPU_REFERENCE.close?.();
});
