#!/usr/bin/python3
"""Paired per-seed differences from a `specmoe bench ssmoe` result (OUT/ssmoe.json).

Seeds share the model, the data and the corruption, so the difference between two methods on the same
seed removes most of the seed-to-seed spread that makes the per-method intervals of ssmoe.md wide.
Prints Markdown: mean and 95% Student-t half-width (as sm_mean_ci95) of the per-seed difference in
points, and how many seeds favour the first method.

usage: /usr/bin/python3 experiments/ssmoe/paired.py runs/bench-ssmoe/ssmoe.json
"""
import json
import math
import sys

T975 = [0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
        2.042]


def stat(d):
    n = len(d)
    m = sum(d) / n
    if n < 2:
        return m, 0.0
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    return m, (T975[n - 1] if n - 1 <= 30 else 1.96) * sd / math.sqrt(n)


def row(label, a, b):
    cells = []
    for key in a:
        d = [x - y for x, y in zip(a[key], b[key])]
        m, h = stat(d)
        cells.append("%+.2f ± %.2f (%d/%d)" % (m, h, sum(x > 0 for x in d), len(d)))
    return "| %s | %s |" % (label, " | ".join(cells))


def seeds(obj, keys):
    return {k: obj[k]["per_seed"] for k in keys}


def main(path):
    r = json.load(open(path))
    task, probe = ("clean", "corrupted"), ("probe_test", "probe_test_corrupted")
    for c in r["configs"]:
        print("\n### %d experts, top-%d: paired differences, points (seeds with a gain / seeds)\n" % (c["E"], c["k"]))
        meth = {m["method"]: seeds(m, task) for m in c["methods"]}
        print("| A - B | clean | corrupted |\n|---|---|---|")
        for a, b in [("SSMoE-full", "Original"), ("SSMoE-avgEV", "Original"), ("SSMoE-drop", "Router-drop"),
                     ("SSMoE-drop", "RandDrop"), ("Router-drop", "RandDrop"), ("SSMoE-drop + mixed", "Router-drop"),
                     ("SSMoE-drop + mixed", "Original"), ("SSMoE-drop + mixed", "RandDrop")]:
            print(row("%s - %s" % (a, b), meth[a], meth[b]))
        sweep = {s["alpha"]: s for s in c["alpha_sweep"]}
        if 0 in sweep and "probe_test" in sweep[0]:
            base = seeds(sweep[0], probe)
            print("\nProbe (held-out classes): each routing embedding minus the learned router's (alpha 0)\n")
            print("| embedding | probe test | probe corrupted |\n|---|---|---|")
            for a, s in sorted(sweep.items()):
                if a != 0:
                    print(row("alpha %g" % a, seeds(s, probe), base))
            for cs in c["c_sweep"]:
                print(row("alpha %g, c %d" % (r["alpha"], cs["c"]), seeds(cs, probe), base))
            for name in ("alpha", "c"):
                print(row("value of %s picked on validation" % name, seeds(c["picked"][name], probe), base))


if __name__ == "__main__":
    main(sys.argv[1])
