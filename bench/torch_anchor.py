"""Speed anchor for `deno task bench`, run on the GPU machine beside it (PyTorch + CUDA).

Times, on the same shapes as bench/main.ts:
  - a device-to-device copy (GB/s counted as read + write bytes),
  - paged decode attention the way an engine without a paged kernel would do it: gather the
    pages into contiguous K/V, then SDPA (the gather is reported separately),
  - SDPA decode on contiguous K/V (the "reads KV at ~4.2 TB/s" anchor),
  - causal prefill with SDPA at 4 x 1024 and 8 x 4096 (TFLOP/s, causal flops = 2 * T * S * H * D).

Usage: python3 bench/torch_anchor.py [--json [FILE]]
  --json       the JSON instead of the text, on stdout
  --json FILE  the text on stdout and the JSON into FILE (what `deno task bench --anchor FILE`
               reads: each SDPA row's "shape" names the bench shape it anchors)
"""

import json
import os
import sys

import torch
import torch.nn.functional as F


def bench(fn, iters=50, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters  # ms


def json_target(argv):
    """None: text only; "-": JSON on stdout instead of the text; else the file for the JSON."""
    for i, a in enumerate(argv):
        if a.startswith("--json="):
            return a[len("--json="):] or "-"
        if a == "--json":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return nxt if nxt and not nxt.startswith("-") else "-"
    return None


def main():
    target = json_target(sys.argv[1:])
    dev = torch.device("cuda")
    rows = []

    n = 2 << 30  # 2 GiB copy
    a = torch.empty(n // 4, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a), iters=20)
    rows.append({"case": "copy 2GiB", "ms": ms, "GB/s": 2 * n / ms / 1e6})
    del a, b

    # Decode: 32 requests x 2048 context (and 64 x 8192), 32 q heads, 8 kv heads, head 128, f16.
    for reqs, ctx in [(32, 2048), (64, 8192)]:
        hq, hkv, d, bs = 32, 8, 128, 16
        nblk = reqs * ctx // bs
        kc = torch.randn(nblk, bs, hkv, d, dtype=torch.float16, device=dev)
        vc = torch.randn_like(kc)
        bt = torch.randperm(nblk, device=dev).view(reqs, ctx // bs)
        q = torch.randn(reqs, hq, 1, d, dtype=torch.float16, device=dev)
        kv_bytes = 2 * reqs * ctx * hkv * d * 2

        def gather():
            k = kc[bt].view(reqs, ctx, hkv, d).transpose(1, 2)
            v = vc[bt].view(reqs, ctx, hkv, d).transpose(1, 2)
            return k, v

        k, v = gather()
        k = k.contiguous()
        v = v.contiguous()
        ms_g = bench(lambda: gather()[0].contiguous())
        ms_sdpa = bench(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        rows.append({"case": f"decode sdpa contiguous {reqs}x{ctx}", "ms": ms_sdpa,
                     "GB/s": kv_bytes / ms_sdpa / 1e6,
                     "shape": {"kind": "decode", "reqs": reqs, "ctx": ctx, "qlen": 1,
                               "num_heads": hq, "num_kv_heads": hkv, "head_size": d}})
        rows.append({"case": f"decode page gather (K only) {reqs}x{ctx}", "ms": ms_g,
                     "GB/s": kv_bytes / 2 * 2 / ms_g / 1e6})
        del kc, vc, k, v

    # Prefill: 4 x 1024 and 8 x 4096 causal, 32 heads, 8 kv heads, head 128, f16.
    for b_, t in [(4, 1024), (8, 4096)]:
        hq, hkv, d = 32, 8, 128
        q = torch.randn(b_, hq, t, d, dtype=torch.float16, device=dev)
        k = torch.randn(b_, hkv, t, d, dtype=torch.float16, device=dev)
        v = torch.randn_like(k)
        ms = bench(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            iters=20,
        )
        flops = 4 * b_ * t * t * hq * d / 2
        rows.append({"case": f"prefill sdpa causal {b_}x{t}", "ms": ms,
                     "TFLOP/s": flops / ms / 1e9,
                     "shape": {"kind": "prefill", "reqs": b_, "ctx": t, "qlen": t,
                               "num_heads": hq, "num_kv_heads": hkv, "head_size": d}})
        del q, k, v

    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if target == "-":
        print(json.dumps(doc))
        return
    print("torch", torch.__version__, torch.cuda.get_device_name())
    for r in rows:
        extra = " ".join(f"{k}={v:.1f}" for k, v in r.items() if k not in ("case", "ms", "shape"))
        print(f"{r['case']:<44} {r['ms']:8.3f} ms  {extra}")
    if target is not None:
        with open(target + ".part", "w") as fh:  # renamed when whole: a cut run leaves no file
            json.dump(doc, fh, indent=1)
        os.replace(target + ".part", target)
        print("json:", target)


if __name__ == "__main__":
    main()
