"""A Python standard-library client of the attention service, with its own reference.

Creates a server-held cache, runs a prefill then a decode step over it, and checks both
against a float64 computation done here: an answer off by more than TOL (float32 data and
cache) is an AssertionError, exit status 1. Usage: python3 examples/python_client.py [URL]
"""
import json
import math
import random
import sys
import urllib.error
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"


def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(URL + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


H, KVH, D, BS = 4, 2, 64, 16
TOL = 1e-4  # float32 in and out: what the service's own tests allow
status, cache = call("POST", "/v1/kv-caches", {"num_blocks": 8, "block_size": BS, "num_kv_heads": KVH,
                                                "head_size": D, "dtype": "float32"})
assert status == 201, (status, cache)
keys, values = [[], []], [[], []]  # per request: list of [KVH][D] rows
table = [[3, 5], [6, 1]]


def step(qlens, ctx):
    q, k, v, slots = [], [], [], []
    for r, ql in enumerate(qlens):
        for j in range(ql):
            pos = ctx[r] - ql + j
            qt = [[random.uniform(-1, 1) for _ in range(D)] for _ in range(H)]
            kt = [[random.uniform(-1, 1) for _ in range(D)] for _ in range(KVH)]
            vt = [[random.uniform(-1, 1) for _ in range(D)] for _ in range(KVH)]
            keys[r].append(kt); values[r].append(vt)
            q.append(qt); k.append(kt); v.append(vt)
            slots.append(table[r][pos // BS] * BS + pos % BS)
    T = len(q)
    flat = lambda t: [x for tok in t for head in tok for x in head]
    body = {"dtype": "float32", "layer": {"num_heads": H, "num_kv_heads": KVH, "head_size": D},
            "query": {"dtype": "float32", "shape": [T, H, D], "data": flat(q)},
            "key": {"dtype": "float32", "shape": [T, KVH, D], "data": flat(k)},
            "value": {"dtype": "float32", "shape": [T, KVH, D], "data": flat(v)},
            "metadata": {"query_start_loc": [0, qlens[0], qlens[0] + qlens[1]], "seq_lens": ctx,
                         "block_table": table, "slot_mapping": slots},
            "kv_cache": cache["id"], "return_lse": True}
    status, out = call("POST", "/v1/attention/forward", body)
    assert status == 200, (status, out)
    # Reference: causal attention in float64.
    worst, t = 0.0, 0
    for r, ql in enumerate(qlens):
        for j in range(ql):
            p = ctx[r] - ql + j
            for h in range(H):
                g = h // (H // KVH)
                s = [sum(a * b for a, b in zip(q[t][h], keys[r][kk][g])) / math.sqrt(D) for kk in range(p + 1)]
                m = max(s)
                e = [math.exp(x - m) for x in s]
                z = sum(e)
                for d in range(D):
                    ref = sum(e[kk] * values[r][kk][g][d] for kk in range(p + 1)) / z
                    got = out["output"]["data"][(t * H + h) * D + d]
                    worst = max(worst, abs(got - ref))
            t += 1
    return out["backend"], worst


for name, qlens, ctx in [("prefill", [5, 3], [5, 3]), ("decode ", [1, 1], [6, 4])]:
    backend, worst = step(qlens, ctx)
    print(name, backend, worst)
    assert worst < TOL, f"{name}: max |error| {worst} over {TOL}"
status, bad = call("POST", "/v1/attention/forward", {"dtype": "float32"})
print("bad body ->", status, bad["code"], bad["issues"][0]["path"])
assert status == 400 and bad["code"] == "invalid_request", (status, bad)
status, _ = call("DELETE", f"/v1/kv-caches/{cache['id']}")
print("delete ->", status)
assert status == 204, status
