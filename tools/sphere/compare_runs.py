#!/usr/bin/env python3
"""Seed-level comparison of bench-sphere cells from runs.jsonl (BENCHMARKS.md, "Full tier").

    tools/sphere/compare_runs.py RUNS.jsonl A_METHOD:A_PROTOCOL B_METHOD:B_PROTOCOL [B2 ...] [--family cheetah] [--paired]
        [--alternative greater|less]

Each seed's value is its mean score over the sequence's tasks; a seed counts only when every task of
it is in the file. For each B: both sets of seed means, their means, B's change relative to A,
Welch's t, and an exact one-sided p of "B's mean exceeds A's" (--alternative less: "B's mean is
below A's", e.g. A = SPHERE against each baseline B):
  - unpaired (default): a permutation test over every split of the pooled seeds;
  - --paired: a sign-flip test of the per-seed differences over the seeds both cells have (every
    assignment of signs), for cells that share their seeds' runs, e.g. one method under RL and CRL
    (a CRL chain's first task is its RL run of that task).
With several B cells, Holm's step-down adjustment of their p values for the family of comparisons is
printed too (holm_p).
"""
import argparse
import itertools
import json
import math
import statistics as st
import sys


def seed_means(path, family, method, protocol, tasks=3):
    per = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                j = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            if j.get("family") == family and j.get("method") == method and j.get("protocol") == protocol:
                per.setdefault(j["seed"], {})[j["task_index"]] = j["score"]
    return {s: sum(v.values()) / tasks for s, v in sorted(per.items()) if len(v) == tasks}


def permutation_p(a, b):
    """one-sided: the share of splits of the pooled values whose mean difference is at least the observed"""
    pooled, obs, hits, total = a + b, st.mean(b) - st.mean(a), 0, 0
    for idx in itertools.combinations(range(len(pooled)), len(b)):
        g1 = [pooled[i] for i in idx]
        g0 = [pooled[i] for i in range(len(pooled)) if i not in idx]
        total += 1
        hits += st.mean(g1) - st.mean(g0) >= obs - 1e-12
    return hits / total, total


def sign_flip_p(d):
    """one-sided: the share of sign assignments of the differences d whose mean is at least the observed"""
    obs, hits, total = st.mean(d), 0, 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        total += 1
        hits += st.mean([s * x for s, x in zip(signs, d)]) >= obs - 1e-12
    return hits / total, total


def holm(ps):
    """Holm's step-down adjusted p values, in the order given"""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, run = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = run
    return adj


def cell(path, family, spec):
    if spec.count(":") != 1:
        sys.exit(f"compare_runs: '{spec}' is not METHOD:PROTOCOL")
    return seed_means(path, family, *spec.split(":"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("a", help="METHOD:PROTOCOL (protocol rl or crl)")
    ap.add_argument("b", nargs="+", help="METHOD:PROTOCOL, one or more")
    ap.add_argument("--family", default="cheetah")
    ap.add_argument("--paired", action="store_true", help="sign-flip test over the seeds both cells have")
    ap.add_argument("--alternative", choices=("greater", "less"), default="greater", help="B's mean above A's, or below")
    o = ap.parse_args()
    A = cell(o.runs, o.family, o.a)
    a = list(A.values())
    if len(a) < 2:
        sys.exit(f"compare_runs: need at least 2 complete seeds in {o.a} (have {len(a)})")
    print(f"{o.a}: seeds {[round(x, 1) for x in a]} mean {st.mean(a):.1f} +- {st.stdev(a):.1f}")
    ps, sg = [], 1 if o.alternative == "greater" else -1
    for spec in o.b:
        B = cell(o.runs, o.family, spec)
        b = list(B.values())
        if len(b) < 2:
            sys.exit(f"compare_runs: need at least 2 complete seeds in {spec} (have {len(b)})")
        ma, mb = st.mean(a), st.mean(b)
        se = math.sqrt(st.variance(a) / len(a) + st.variance(b) / len(b))
        # both cells without spread (e.g. every seed's success the same): t is infinite, or undefined
        t = (mb - ma) / se if se > 0 else (math.copysign(math.inf, mb - ma) if mb != ma else math.nan)
        if o.paired:
            common = sorted(set(A) & set(B))
            if len(common) < 2:
                sys.exit(f"compare_runs: --paired needs at least 2 seeds in both {o.a} and {spec} (have {len(common)})")
            p, total = sign_flip_p([sg * (B[s] - A[s]) for s in common])
            how = f"one-sided ({o.alternative}) sign-flip p {p:.3f} ({total} sign assignments, seeds {common})"
        else:
            p, total = permutation_p([sg * x for x in a], [sg * x for x in b])
            how = f"one-sided ({o.alternative}) permutation p {p:.3f} ({total} splits)"
        ps.append(p)
        print(f"{spec}: seeds {[round(x, 1) for x in b]} mean {mb:.1f} +- {st.stdev(b):.1f}")
        print(f"change {100 * (mb / ma - 1):+.1f}%  welch_t {t:.2f}  {how}")
    if len(ps) > 1:
        print("holm_p " + "  ".join(f"{spec} {q:.3f}" for spec, q in zip(o.b, holm(ps))))


if __name__ == "__main__":
    main()
