#!/usr/bin/python3
"""Reference tensors for the image ops of include/specmoe/conv.h, from PyTorch.

Writes tests/data/conv_reference.safetensors, read by tests/test_conv_reference.c (llm.c
test_gpt2.c style: inputs, outputs and gradients from an independent implementation).

Each case runs one torch.nn.functional op - conv2d, max_pool2d, avg_pool2d or adaptive_avg_pool2d -
in float64 with autograd on inputs drawn and rounded to float32 (the values the file stores and the C
test starts from), so the only difference the C test sees is its own float32 arithmetic. For the
loss L = sum(out * G) with a fixed upstream gradient G the file holds, under "<case>.":

    x (B,C,H,W), G, out, dx                      every op
    weight (OC,C,KH,KW), dweight                 conv2d
    bias (OC), dbias                             conv2d with a bias
    idx (B,C,OH,OW)                              max_pool2d: argmax as h*W + w per plane, stored as
                                                 F32 (exact for these small integers)

and the metadata holds "<case>.config" (JSON: the op and its sizes), "cases" (the case names in
order), "magic" = "specmoe-reference" and "version" = "1".

Max-pooling inputs are redrawn (next seed) until every window's largest value beats the runner-up
by more than TIE_MIN, so the argmax (and hence the gradient) is well defined.

Run from the repo root with Debian's interpreter:  /usr/bin/python3 tools/reference/conv_reference.py
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import safetensors_torch  # noqa: E402  (tools/safetensors_torch.py)

torch.set_default_dtype(torch.float64)

TIE_MIN = 1e-3

# The stem's usual layer (3x3, stride 2, padding 1) first; then a non-square kernel without padding
# or bias, and a wider 5x5 / stride 2 / padding 2 layer with more channels.
CASES = {
    "conv0": dict(op="conv2d", B=2, C=3, H=8, W=7, OC=4, KH=3, KW=3, stride=2, pad=1, bias=1),
    "conv1": dict(op="conv2d", B=2, C=2, H=6, W=9, OC=3, KH=2, KW=4, stride=1, pad=0, bias=0),
    "conv2": dict(op="conv2d", B=1, C=4, H=10, W=11, OC=8, KH=5, KW=5, stride=2, pad=2, bias=1),
    "maxpool0": dict(op="max_pool2d", B=2, C=3, H=7, W=7, K=3, S=2),   # overlapping windows
    "maxpool1": dict(op="max_pool2d", B=2, C=2, H=6, W=9, K=2, S=2),   # last column unseen
    "avgpool0": dict(op="avg_pool2d", B=2, C=3, H=7, W=7, K=3, S=2),
    "avgpool1": dict(op="avg_pool2d", B=2, C=2, H=6, W=9, K=2, S=2),
    "adaptive0": dict(op="adaptive_avg_pool2d", B=2, C=3, H=7, W=5, OH=3, OW=2),  # non-divisible bins
    "adaptive1": dict(op="adaptive_avg_pool2d", B=2, C=4, H=6, W=6, OH=1, OW=1),  # global average
    "adaptive2": dict(op="adaptive_avg_pool2d", B=1, C=2, H=3, W=4, OH=5, OW=6),  # more outputs than inputs
}


class Rejected(Exception):
    """The drawn inputs make the comparison ill-posed; draw again."""


def f32(t):
    """Rounds to float32 and back: the values the file will hold."""
    return t.float().double()


def window_gap(x, K, S):
    """Smallest (max - runner-up) over all K x K / S windows of x (B,C,H,W)."""
    win = x.unfold(2, K, S).unfold(3, K, S)  # (B,C,OH,OW,K,K)
    top2 = win.flatten(-2).topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).min().item()


def run_case(name, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    B, C, H, W = cfg["B"], cfg["C"], cfg["H"], cfg["W"]
    x = f32(torch.randn(B, C, H, W, generator=g)).requires_grad_(True)
    t = {}
    if cfg["op"] == "conv2d":
        OC, KH, KW = cfg["OC"], cfg["KH"], cfg["KW"]
        w = f32(0.5 * torch.randn(OC, C, KH, KW, generator=g)).requires_grad_(True)
        b = f32(0.5 * torch.randn(OC, generator=g)).requires_grad_(True) if cfg["bias"] else None
        out = F.conv2d(x, w, b, stride=cfg["stride"], padding=cfg["pad"])
        t["weight"] = w
        if b is not None:
            t["bias"] = b
    elif cfg["op"] == "max_pool2d":
        if window_gap(x.detach(), cfg["K"], cfg["S"]) <= TIE_MIN:
            raise Rejected(f"{name}: a max-pool window has a near-tie")
        out, idx = F.max_pool2d(x, cfg["K"], cfg["S"], return_indices=True)
        t["idx"] = idx.double()
    elif cfg["op"] == "avg_pool2d":
        out = F.avg_pool2d(x, cfg["K"], cfg["S"])
    elif cfg["op"] == "adaptive_avg_pool2d":
        out = F.adaptive_avg_pool2d(x, (cfg["OH"], cfg["OW"]))
    else:
        raise ValueError(cfg["op"])
    G = f32(torch.randn(out.shape, generator=g))
    (out * G).sum().backward()
    t["x"], t["G"], t["out"], t["dx"] = x, G, out, x.grad
    if cfg["op"] == "conv2d":
        t["dweight"] = w.grad
        if b is not None:
            t["dbias"] = b.grad
    return {f"{name}.{k}": v.detach() for k, v in t.items()}, tuple(out.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/conv_reference.safetensors")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    tensors = {}
    meta = {"magic": "specmoe-reference", "version": "1", "cases": ",".join(CASES),
            "generator": f"tools/reference/conv_reference.py, torch {torch.__version__}"}
    for i, (name, cfg) in enumerate(CASES.items()):
        seed = args.seed + 1000 * i
        while True:
            try:
                t, shape = run_case(name, cfg, seed)
                break
            except Rejected as e:
                print(f"  {e}; seed {seed} -> {seed + 1}")
                seed += 1
        tensors.update(t)
        meta[f"{name}.config"] = json.dumps(cfg, separators=(",", ":"))
        print(f"{name}: {cfg['op']} out {shape}, seed {seed}")

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    safetensors_torch.save({n: v.float() for n, v in tensors.items()}, args.out, meta)
    print(f"wrote {args.out}: {len(tensors)} tensors, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
