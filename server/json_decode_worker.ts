/**
 * The worker side of {@link JsonDecoder} (server/json_decoder.ts): parses one JSON forward
 * body (the depth and size pre-scan, JSON.parse, the zod schema, tensor decoding) and posts the
 * decoded request back with its tensors' buffers transferred, or the error as plain data.
 * @module
 */
import { decodeJsonForward } from "../wire/codec.ts";
import { parseJson } from "./body.ts";
import { errorToPlain } from "../core/errors.ts";

/** The buffers under every typed array reachable from `x`, once each. */
function buffers(x: unknown, out = new Set<ArrayBuffer>()): ArrayBuffer[] {
  if (ArrayBuffer.isView(x)) {
    if (x.buffer instanceof ArrayBuffer) out.add(x.buffer);
  } else if (x !== null && typeof x === "object") {
    for (const v of Object.values(x)) buffers(v, out);
  }
  return [...out];
}

/** The part of a worker's global scope this module uses. */
interface WorkerScope {
  postMessage(message: unknown, transfer: Transferable[]): void;
  onmessage:
    | ((e: MessageEvent<{ id: number; bytes: Uint8Array } | { id: 0; warm: true }>) => void)
    | null;
}

const scope = self as unknown as WorkerScope;
scope.onmessage = (e) => {
  if ("warm" in e.data) return scope.postMessage({ id: 0 }, []); // JsonDecoder.keepWarm: alive
  const { id, bytes } = e.data;
  try {
    const decoded = decodeJsonForward(parseJson(bytes));
    scope.postMessage({ id, decoded }, buffers(decoded));
  } catch (err) {
    scope.postMessage({ id, error: errorToPlain(err) }, []);
  }
};
