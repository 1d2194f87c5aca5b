#!/usr/bin/env python3
"""Does the held-out eNTK rank predict plasticity? SPHERE's mechanism (Sec. 4, Fig. 3) says a policy
that enters the next task of a CRL sequence with a higher eNTK effective rank learns it better. From a
`bench sphere` runs.jsonl (one record per evaluated run), for each CRL chain: the rank after task k
against the score on task k + 1, Pearson's r over the chains, all methods and the MoE actors alone.

    tools/sphere/rank_vs_score.py RUNS.jsonl
"""
import json
import sys
from collections import defaultdict


def pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    c = sum((a - mx) * (b - my) for a, b in zip(x, y))
    vx = sum((a - mx) ** 2 for a in x)
    vy = sum((b - my) ** 2 for b in y)
    return c / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else float("nan")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    chains = defaultdict(dict)  # (family, method, seed) -> task index -> (score, rank)
    states = set()
    with open(sys.argv[1]) as f:
        for line in f:
            r = json.loads(line)
            if r["protocol"] == "crl" and r.get("entk_srank") is not None:
                chains[(r["family"], r["method"], r["seed"])][r["task_index"]] = (r["score"], r["entk_srank"])
                states.add(r.get("entk_states"))
    if len(states) != 1:
        sys.exit("%s: ranks taken on different numbers of held-out states (%s): evaluate every run with one --states"
                 % (sys.argv[1], ", ".join(str(s) for s in sorted(states, key=str))))
    print("held-out states per rank: %s" % states.pop())
    for fam in sorted({c[0] for c in chains}):
        fc = {(m, s): t for (f, m, s), t in chains.items() if f == fam}
        tasks = 1 + max((k for t in fc.values() for k in t), default=0)
        for sel in (None, ("topk", "dense-moe", "ds-moe", "sphere")):
            for k in range(tasks - 1):
                pairs = [(t[k][1], t[k + 1][0]) for (m, _), t in fc.items() if (not sel or m in sel) and k in t and k + 1 in t]
                if len(pairs) < 3:
                    continue
                x, y = zip(*pairs)
                print("family=%s methods=%s: eNTK rank after task %d vs the score on task %d: Pearson r = %.2f over %d chains"
                      % (fam, ",".join(sel) if sel else "all", k, k + 1, pearson(x, y), len(x)))


if __name__ == "__main__":
    main()
