/**
 * Reading an answer of the attention service: its body, read (a read that fails is a
 * `network_error`, unless the caller aborted) then decoded (a body that cannot be decoded is a
 * `bad_response`), as text or bytes; whether it says it is JSON; and the instance that answered
 * a forward call (`X-Attention-Instance`).
 * @module
 */
import type { ForwardAnswer } from "../wire/client_codec.ts";
import { INSTANCE_HEADER } from "../wire/names.ts";
import { isJsonType, mediaType } from "../wire/media_type.ts";
import { badResponse, networkError } from "./api_error.ts";

/** Reads an answer's body; a failed read is a `network_error` (unless the caller aborted). */
export async function readBody<B>(
  res: Response,
  read: (r: Response) => Promise<B>,
  signal?: AbortSignal,
): Promise<B> {
  try {
    return await read(res);
  } catch (e) {
    throw signal?.aborted ? e : networkError(e, `the ${res.status} answer's body broke off`);
  }
}

/** A successful answer's body, read then decoded; a body it cannot decode is a `bad_response`. */
export async function answer<B, T>(
  res: Response,
  read: (r: Response) => Promise<B>,
  decode: (body: B) => T,
  signal?: AbortSignal,
): Promise<T> {
  const body = await readBody(res, read, signal);
  try {
    return decode(body);
  } catch (e) {
    throw badResponse(res, e);
  }
}

export const readText = (r: Response) => r.text();
export const readBytes = async (r: Response) => new Uint8Array(await r.arrayBuffer());
export const parseJson = <T>(t: string) => JSON.parse(t) as T;

/** The answer, with the instance that sent it (`X-Attention-Instance`) when it named itself. */
export function withInstance(res: Response, ans: ForwardAnswer): ForwardAnswer {
  const instance = res.headers.get(INSTANCE_HEADER);
  if (instance !== null) ans.instance = instance;
  return ans;
}

/** Whether an answer says it is JSON (`application/json`, `application/*+json`). */
export const isJsonAnswer = (res: Response) =>
  isJsonType(mediaType(res.headers.get("content-type")));
