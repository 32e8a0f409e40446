/**
 * The scan worker of the device-thread front (forward_cache_id.ts `scanWorker`): finds the
 * `kv_cache` a big forward body names, off the front's thread, and hands the body's buffer back.
 * @module
 */
import { forwardCacheId } from "./forward_cache_id.ts";

interface Scope {
  postMessage(m: unknown, transfer: Transferable[]): void;
  onmessage: ((e: MessageEvent) => void) | null;
}
const scope = globalThis as unknown as Scope;

scope.onmessage = (e: MessageEvent) => {
  const { n, buffer, offset, length, safetensors } = e.data;
  const id = forwardCacheId(new Uint8Array(buffer, offset, length), safetensors);
  scope.postMessage({ n, buffer, offset, length, id }, [buffer]);
};
