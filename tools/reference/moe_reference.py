#!/usr/bin/python3
"""Reference tensors for the MoE layer and the Adam/AdamW optimisers, from PyTorch.

Writes tests/data/moe_reference.safetensors, read by tests/test_reference.c (llm.c test_gpt2.c
style: inputs, outputs, gradients and optimiser trajectories from an independent implementation).

The layer is written here from its definition, HF-Mixtral style (loop over experts, torch.where on
the expert mask, index_add_ into the output), computed in float64 with autograd giving every
gradient. It is NOT a port of src/moe.c:

    logits = x Wg^T;  p = softmax(logits / temperature);  S_t = top-k of p_t (descending)
    w_t = p_t[S_t] (/ sum p_t[S_t] if renorm)
    capacity cf > 0: cap = ceil(cf T k / E); tokens in order, choices in rank order; a choice whose
        expert already holds cap assignments is dropped (the renorm denominator keeps its p)
    out_t = sum_{kept (e, w)} w E_e(x_t) + sum_s S_s(x_t),   E(x) = W2 act(W1 x + b1) + b2

Inputs and parameters are drawn, rounded to float32 (what the file stores and the C test starts
from) and then used in float64, so the only difference the C test sees is its float32 arithmetic.
Inputs are redrawn (next seed) until the comparison is well posed at every forward, including the
ones inside the optimiser loop:
  * no top-k near-tie: p_(k) - p_(k+1) > 1e-3 for every token (a float32 rounding cannot flip a choice)
  * no ReLU kink: |pre-activation| > 1e-5 wherever an expert runs with ReLU
  * no tiny gradient before an Adam step: every gradient is exactly 0 or |g| > 1e-5 (Adam's first
    step is lr * g / (|g| + eps), which turns a float32 rounding of a tiny g into an O(lr) change)
  * case1 drops at least 2 assignments; every routed expert of case0/case1 gets at least 1 token.

Run from the repo root with Debian's interpreter:  /usr/bin/python3 tools/reference/moe_reference.py
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import safetensors_torch  # noqa: E402  (tools/safetensors_torch.py)

torch.set_default_dtype(torch.float64)

GAP_MIN = 1e-3
KINK_MIN = 1e-5
GRAD_MIN = 1e-5

CASES = {
    "case0": dict(T=24, d=12, H=16, E=6, k=2, temperature=1.0, renorm=1, capacity=0.0, shared=0, act="relu",
                  optim=dict(kind="adam", lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0, steps=3)),
    "case1": dict(T=24, d=12, H=16, E=6, k=2, temperature=0.7, renorm=0, capacity=1.0, shared=1, act="gelu",
                  min_dropped=2,
                  # AdamW as specmoe runs it: biases (b1, b2) are excluded from the decoupled weight
                  # decay (SM_PARAM_NO_DECAY), i.e. torch.optim.AdamW with two parameter groups.
                  optim=dict(kind="adamw", lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.1, steps=3,
                             no_decay=["b1", "b2"])),
    "case2": dict(T=16, d=8, H=8, E=4, k=4, temperature=1.5, renorm=1, capacity=0.0, shared=0, act="tanh"),
}

ACTS = {
    "relu": torch.relu,
    "gelu": lambda z: torch.nn.functional.gelu(z, approximate="none"),  # exact erf form
    "tanh": torch.tanh,
}


class Rejected(Exception):
    """The drawn inputs make the float32-vs-float64 comparison ill-posed; draw again."""


def param_names(prefix, cfg):
    names = [f"{prefix}.router.weight"]
    groups = ["experts"] + (["shared"] if cfg["shared"] > 0 else [])
    for g in groups:
        names += [f"{prefix}.{g}.{t}" for t in ("w1", "b1", "w2", "b2")]
    return names


def f32(t):
    """Rounds to float32 and back: the values the file will hold."""
    return t.float().double()


def draw(cfg, prefix, gen):
    """x, G and parameters (nn.Linear default init U(-1/sqrt(fan_in), 1/sqrt(fan_in))), float32-exact."""
    T, d, H, E, S = cfg["T"], cfg["d"], cfg["H"], cfg["E"], cfg["shared"]

    def unif(shape, fan_in):
        a = 1.0 / math.sqrt(fan_in)
        return f32((torch.rand(shape, generator=gen) * 2 - 1) * a)

    x = f32(torch.randn(T, d, generator=gen))
    G = f32(torch.randn(T, d, generator=gen))
    P = {f"{prefix}.router.weight": unif((E, d), d)}
    for g, n in (("experts", E), ("shared", S)):
        if n == 0:
            continue
        P[f"{prefix}.{g}.w1"] = unif((n, H, d), d)
        P[f"{prefix}.{g}.b1"] = unif((n, H), d)
        P[f"{prefix}.{g}.w2"] = unif((n, d, H), H)
        P[f"{prefix}.{g}.b2"] = unif((n, d), H)
    for t in P.values():
        t.requires_grad_(True)
    return x, G, P


def expert(xs, w1, b1, w2, b2, act, kinks):
    pre = xs @ w1.t() + b1
    if kinks is not None and pre.numel():
        kinks.append(pre.detach().abs().min().item())
    return act(pre) @ w2.t() + b2


def moe_forward(x, P, cfg, prefix, check):
    """HF-Mixtral-style sparse MoE block. Returns (out, info) with info the routing statistics.
    check: reject inputs whose comparison against float32 would be ill-posed."""
    T, d, E, k = cfg["T"], cfg["d"], cfg["E"], cfg["k"]
    act = ACTS[cfg["act"]]
    logits = x @ P[f"{prefix}.router.weight"].t()                       # (T,E)
    probs = torch.softmax(logits / cfg["temperature"], dim=-1)          # (T,E)
    routing_weights, selected = torch.topk(probs, k, dim=-1)            # (T,k), descending
    if check and k < E:
        srt = probs.detach().sort(dim=-1, descending=True).values
        gap = (srt[:, k - 1] - srt[:, k]).min().item()
        if gap <= GAP_MIN:
            raise Rejected(f"top-k near-tie (gap {gap:.2e})")
    if cfg["renorm"]:
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)

    # (E,k,T) one-hot of the choices; the capacity limit clears the dropped ones
    expert_mask = torch.nn.functional.one_hot(selected, num_classes=E).permute(2, 1, 0).clone()
    dropped = 0
    if cfg["capacity"] > 0:
        cap = math.ceil(cfg["capacity"] * T * k / E)
        held = [0] * E
        for t in range(T):
            for j in range(k):
                e = selected[t, j].item()
                if held[e] >= cap:
                    expert_mask[e, j, t] = 0
                    dropped += 1
                else:
                    held[e] += 1
    load = expert_mask.sum(dim=(1, 2))                                  # (E,)

    kinks = [] if (check and cfg["act"] == "relu") else None
    out = torch.zeros(T, d)
    for e in range(E):
        idx, top_x = torch.where(expert_mask[e])                        # choice rank, token
        if top_x.numel() == 0:
            continue
        cur = x.index_select(0, top_x)
        w = [P[f"{prefix}.experts.{n}"][e] for n in ("w1", "b1", "w2", "b2")]
        y = expert(cur, *w, act, kinks) * routing_weights[top_x, idx, None]
        out = out.index_add(0, top_x, y)
    for s in range(cfg["shared"]):
        w = [P[f"{prefix}.shared.{n}"][s] for n in ("w1", "b1", "w2", "b2")]
        out = out + expert(x, *w, act, kinks)
    if kinks and min(kinks) <= KINK_MIN:
        raise Rejected(f"ReLU kink (|pre| {min(kinks):.2e})")
    return out, dict(probs=probs.detach(), load=load, dropped=dropped)


def check_grads(tensors):
    for name, g in tensors:
        a = g.detach().abs()
        tiny = ((a > 0) & (a <= GRAD_MIN)).sum().item()
        if tiny:
            raise Rejected(f"{tiny} tiny gradients in {name} (min {a[a > 0].min().item():.2e})")


def make_optimizer(params, P, cfg):
    oc = cfg["optim"]
    if oc["kind"] == "adam":
        return torch.optim.Adam(params, lr=oc["lr"], betas=tuple(oc["betas"]), eps=oc["eps"])
    decay = [t for n, t in P.items() if n.rsplit(".", 1)[1] not in oc["no_decay"]]
    no_decay = [t for n, t in P.items() if n.rsplit(".", 1)[1] in oc["no_decay"]]
    return torch.optim.AdamW([{"params": decay, "weight_decay": oc["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=oc["lr"], betas=tuple(oc["betas"]), eps=oc["eps"])


def build_case(name, cfg, seed):
    """Draws inputs from seed and computes every stored tensor; raises Rejected if ill-posed."""
    prefix = f"{name}.layer"
    gen = torch.Generator().manual_seed(seed)
    x, G, P = draw(cfg, prefix, gen)
    x.requires_grad_(True)
    out, info = moe_forward(x, P, cfg, prefix, check=True)
    (out * G).sum().backward()
    if info["dropped"] < cfg.get("min_dropped", 0):
        raise Rejected(f"only {info['dropped']} dropped")
    if cfg["k"] < cfg["E"] and int(info["load"].min()) == 0:
        raise Rejected("an expert received no token")
    res = {f"{name}.x": x.detach(), f"{name}.G": G, f"{name}.out": out.detach(), f"{name}.dx": x.grad.clone(),
           f"{name}.probs": info["probs"], f"{name}.load": info["load"].double(),
           f"{name}.dropped": torch.tensor([float(info["dropped"])])}
    for n, t in P.items():
        res[n] = t.detach().clone()
        res[n + ".grad"] = t.grad.clone()
    if "optim" in cfg:
        check_grads((n, t.grad) for n, t in P.items())
        oc = cfg["optim"]
        opt = make_optimizer(list(P.values()), P, cfg)
        x = x.detach()
        for step in range(1, oc["steps"] + 1):
            opt.zero_grad()
            out, _ = moe_forward(x, P, cfg, prefix, check=True)
            (out * G).sum().backward()
            check_grads((n, t.grad) for n, t in P.items())
            opt.step()
            for n, t in P.items():
                res[f"{name}.{oc['kind']}_step{step}.{n}"] = t.detach().clone()
    return res, info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "moe_reference.safetensors"))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    tensors = {}
    meta = {"magic": "specmoe-reference", "version": "1",
            "generator": f"tools/reference/moe_reference.py (torch {torch.__version__}, float64)",
            "loss": "sum(out * G)", "cases": ",".join(CASES)}
    for ci, (name, cfg) in enumerate(CASES.items()):
        for attempt in range(1000):
            seed = args.seed + 1000 * ci + attempt
            try:
                res, info = build_case(name, cfg, seed)
                break
            except Rejected as why:
                print(f"{name}: seed {seed} rejected: {why}")
        else:
            sys.exit(f"moe_reference: {name}: no acceptable draw in 1000 seeds")
        conf = {k: v for k, v in cfg.items() if k not in ("optim", "min_dropped")}
        conf["seed"] = seed
        meta[f"{name}.config"] = json.dumps(conf, sort_keys=True)
        if "optim" in cfg:
            meta[f"{name}.optim"] = json.dumps(cfg["optim"], sort_keys=True)
        tensors.update(res)
        print(f"{name}: seed {seed}, load {info['load'].tolist()}, dropped {info['dropped']}")

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    safetensors_torch.save({n: t.float() for n, t in tensors.items()}, args.out, meta)
    print(f"wrote {args.out}: {len(tensors)} tensors, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
