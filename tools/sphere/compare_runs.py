#!/usr/bin/env python3
"""Seed-level comparison of two bench-sphere cells from runs.jsonl (BENCHMARKS.md, "Full tier").

    tools/sphere/compare_runs.py RUNS.jsonl A_METHOD:A_PROTOCOL B_METHOD:B_PROTOCOL [--family cheetah]

Each seed's value is its mean score over the sequence's tasks; a seed counts only when every task of
it is in the file. Prints both sets of seed means, their means, B's change relative to A, Welch's t,
and the exact one-sided permutation p of "B's mean exceeds A's" over every split of the pooled seeds.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("a", help="METHOD:PROTOCOL (protocol rl or crl)")
    ap.add_argument("b", help="METHOD:PROTOCOL")
    ap.add_argument("--family", default="cheetah")
    o = ap.parse_args()
    cells = []
    for spec in (o.a, o.b):
        if spec.count(":") != 1:
            sys.exit(f"compare_runs: '{spec}' is not METHOD:PROTOCOL")
        cells.append(list(seed_means(o.runs, o.family, *spec.split(":")).values()))
    a, b = cells
    if len(a) < 2 or len(b) < 2:
        sys.exit(f"compare_runs: need at least 2 complete seeds per cell (have {len(a)} and {len(b)})")
    ma, mb = st.mean(a), st.mean(b)
    t = (mb - ma) / math.sqrt(st.variance(a) / len(a) + st.variance(b) / len(b))
    pooled, obs, hits, total = a + b, mb - ma, 0, 0
    for idx in itertools.combinations(range(len(pooled)), len(b)):
        g1 = [pooled[i] for i in idx]
        g0 = [pooled[i] for i in range(len(pooled)) if i not in idx]
        total += 1
        hits += st.mean(g1) - st.mean(g0) >= obs - 1e-12
    print(f"{o.a}: seeds {[round(x, 1) for x in a]} mean {ma:.1f} +- {st.stdev(a):.1f}")
    print(f"{o.b}: seeds {[round(x, 1) for x in b]} mean {mb:.1f} +- {st.stdev(b):.1f}")
    print(f"change {100 * (mb / ma - 1):+.1f}%  welch_t {t:.2f}  one-sided permutation p {hits / total:.3f} ({total} splits)")


if __name__ == "__main__":
    main()
