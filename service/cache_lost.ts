/**
 * The error for a call on a server-held cache that was lost with its device (503: its contents
 * are gone until a cache file restores them).
 * @module
 */
import { DeviceUnavailableError } from "../core/errors.ts";

export function cacheLost(id: string): DeviceUnavailableError {
  return new DeviceUnavailableError(
    `KV cache ${id} was lost with its device; its contents are gone`,
  );
}
