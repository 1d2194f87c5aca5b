#!/usr/bin/python3
"""Independent check that a Hugging Face MoE model directory is what its config.json says.

Written apart from specmoe's C reader (src/hf.c), in Python with torch, to check what
`specmoe ssmoe prune --hf` writes. It loads every shard (through model.safetensors.index.json when
there is one) and does what transformers' from_pretrained does for these model types: it builds the
expected MoE keys and shapes from config.json and refuses missing keys, unexpected expert keys and
shape mismatches. With --ev it also loads the EV router beside the model and computes EV logits for
random tokens with torch (logit of expert e = mean over its 3 rows of x . row).

    /usr/bin/python3 tools/hf_check.py DIR [--ev FILE]

Debian 12 has no python3-transformers, so from_pretrained itself is not run here.
"""
import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_torch as st  # noqa: E402

# model_type -> (expert-count key, intermediate-size key, MoE block, matrix names gate/up/down)
FAMILIES = {
    "mixtral": ("num_local_experts", "intermediate_size", "block_sparse_moe", ("w1", "w3", "w2")),
    "olmoe": ("num_experts", "intermediate_size", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "qwen2_moe": ("num_experts", "moe_intermediate_size", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "qwen3_moe": ("num_experts", "moe_intermediate_size", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "deepseek": ("n_routed_experts", "moe_intermediate_size", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "deepseek_v2": ("n_routed_experts", "moe_intermediate_size", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "deepseek_v3": ("n_routed_experts", "moe_intermediate_size", "mlp", ("gate_proj", "up_proj", "down_proj")),
}


def moe_layers(cfg):
    n = cfg["num_hidden_layers"]
    t = cfg["model_type"]
    if t.startswith("qwen"):
        step = cfg.get("decoder_sparse_step") or 1
        only = set(cfg.get("mlp_only_layers") or [])
        return [l for l in range(n) if l not in only and (l + 1) % step == 0]
    if t.startswith("deepseek"):
        first = cfg.get("first_k_dense_replace") or 0
        freq = cfg.get("moe_layer_freq") or 1
        return [l for l in range(n) if l >= first and l % freq == 0]
    return list(range(n))


def load_all(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
    else:
        wmap, files = None, ["model.safetensors"]
    tensors = {}
    for fn in files:
        t, meta = st.load(os.path.join(d, fn))
        if meta.get("format", "pt") != "pt":
            raise SystemExit(f"{fn}: metadata format {meta.get('format')!r} is not 'pt'")
        for k, v in t.items():
            if wmap is not None and wmap.get(k) != fn:
                raise SystemExit(f"{fn}: tensor {k} is not mapped to this shard in the index")
            tensors[k] = v
    if wmap is not None and set(wmap) != set(tensors):
        raise SystemExit(f"index and shards disagree: {sorted(set(wmap) ^ set(tensors))[:5]}")
    return tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--ev")
    a = ap.parse_args()
    with open(os.path.join(a.dir, "config.json")) as f:
        cfg = json.load(f)
    ekey, ikey, block, w = FAMILIES[cfg["model_type"]]
    E, I, d = cfg[ekey], cfg[ikey], cfg["hidden_size"]
    if not 1 <= cfg["num_experts_per_tok"] <= E:
        raise SystemExit(f"num_experts_per_tok {cfg['num_experts_per_tok']} outside [1, {E}]")
    t = load_all(a.dir)
    layers = moe_layers(cfg)
    for l in layers:
        b = f"model.layers.{l}.{block}"
        expect = {f"{b}.gate.weight": (E, d)}
        if f"{b}.gate.e_score_correction_bias" in t:
            expect[f"{b}.gate.e_score_correction_bias"] = (E,)
        if f"{b}.experts.gate_up_proj" in t:
            gu = tuple(t[f"{b}.experts.gate_up_proj"].shape)
            fused = gu == (E, 2 * I, d) if d != 2 * I else tuple(t[f"{b}.experts.down_proj"].shape) == (E, d, I)
            expect[f"{b}.experts.gate_up_proj"] = (E, 2 * I, d) if fused else (E, d, 2 * I)
            expect[f"{b}.experts.down_proj"] = (E, d, I) if fused else (E, I, d)
        else:
            for e in range(E):
                for j, m in enumerate(w):
                    expect[f"{b}.experts.{e}.{m}.weight"] = (I, d) if j < 2 else (d, I)
        for k, shape in expect.items():
            if k not in t:
                raise SystemExit(f"missing key {k}")
            if tuple(t[k].shape) != shape:
                raise SystemExit(f"{k}: shape {tuple(t[k].shape)}, config implies {shape}")
        pat = re.compile(re.escape(b) + r"\.experts\.(\d+)\.")
        for k in t:
            m = pat.match(k)
            if m and int(m.group(1)) >= E:
                raise SystemExit(f"unexpected key {k} (config.json has {E} experts)")
        if not torch.isfinite(t[f"{b}.gate.weight"].float()).all():
            raise SystemExit(f"{b}.gate.weight is not finite")
    msg = f"hf_check: {a.dir} ok: {len(t)} tensors, {len(layers)} MoE layers of {E} experts"
    if a.ev:
        ev, meta = st.load(a.ev)
        x = torch.randn(5, d, generator=torch.Generator().manual_seed(0))
        for l in layers:
            W = ev[f"model.layers.{l}.{block}.ev_gate.weight"]
            if tuple(W.shape) != (3 * E, d):
                raise SystemExit(f"EV router of layer {l}: shape {tuple(W.shape)}, want {(3 * E, d)}")
            logits = torch.nn.functional.linear(x, W.float()).view(5, E, 3).mean(-1)
            if not torch.isfinite(logits).all():
                raise SystemExit(f"EV logits of layer {l} are not finite")
        msg += f"; EV router {a.ev} gives finite (5, {E}) logits in every layer (c = {meta.get('ev_c')})"
    print(msg)


if __name__ == "__main__":
    main()
