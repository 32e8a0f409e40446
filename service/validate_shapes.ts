/**
 * The shapes of a forward request's query, key and value against its layer (part of
 * service/validate.ts's {@link validateForward}): each problem is added to the call's
 * {@link Issues}, and the token counts the metadata is checked against are returned.
 * @module
 */
import type { ForwardInput } from "../wire/codec.ts";
import type { DataTensor } from "../wire/tensors.ts";
import type { LayerSpec } from "../core/types.ts";
import { eqShape, fmt, type Issues } from "./validate_layer.ts";

/**
 * Checks that the query is [num_tokens, num_heads, head_size]; returns its tokens (`T`, 0 when
 * its shape has none).
 */
export function checkQueryShape(q: DataTensor, layer: LayerSpec, is: Issues): number {
  const { num_heads: H, head_size: D } = layer;
  if (q.shape.length !== 3 || q.shape[1] !== H || q.shape[2] !== D) {
    is.add(
      ["query", "shape"],
      `must be [num_tokens, ${H}, ${D}] (num_heads, head_size), got ${fmt(q.shape)}`,
    );
  }
  return q.shape[0] ?? 0;
}

/**
 * Checks key and value against the layer and the query's `T` tokens: both or neither (neither
 * only for encoder_decoder), the key [num_kv_tokens, num_kv_heads, head_size] with `T` tokens
 * unless encoder_decoder, the value of the key's shape. Returns the key rows the slots are
 * checked against (`Tk`): the key's for encoder_decoder (0 without a key), else `T`.
 */
export function checkKeyValueShapes(
  input: ForwardInput,
  layer: LayerSpec,
  T: number,
  is: Issues,
): number {
  const { num_kv_heads: Hkv, head_size: D } = layer;
  const cross = layer.attn_type === "encoder_decoder";
  if ((input.key === undefined) !== (input.value === undefined)) {
    is.add([input.key ? "value" : "key"], "key and value come together");
  } else if (input.key && input.value) {
    const k = input.key, v = input.value;
    if (k.shape.length !== 3 || k.shape[1] !== Hkv || k.shape[2] !== D) {
      is.add(
        ["key", "shape"],
        `must be [num_kv_tokens, ${Hkv}, ${D}] (num_kv_heads, head_size), got ${fmt(k.shape)}`,
      );
    } else if (!cross && k.shape[0] !== T) {
      is.add(["key", "shape", 0], `has ${k.shape[0]} tokens but query has ${T}`);
    }
    if (!eqShape(v.shape, k.shape)) {
      is.add(["value", "shape"], `is ${fmt(v.shape)} but key is ${fmt(k.shape)}`);
    }
    if (cross) return k.shape[0] ?? 0;
  } else if (!cross) {
    is.add(["key"], `attn_type ${layer.attn_type} needs key and value`);
  }
  return cross ? 0 : T;
}
