#!/bin/bash
# What is left of `bench tokenize --tier full`, figure by figure, priced: the planned runs with no
# `done` under RUNS (the archive, or a bench --out) and their CPU hours by a table of tier_cost.sh.
# A run two figures share (Fig. 1's softmoe-4 is also Figs. 12's and 19's) is counted under the first
# figure named. A variant the table lacks is priced as its temperature-1 twin (`sharp`'s -t0.1), or
# printed with "?" and left out of the total.
#
#   tools/softmoe_rl/tier_left.sh [BINARY] [COST_TABLE] [RUNS] [FIGURES]
#     BINARY       build/specmoe
#     COST_TABLE   docs/results/tokenize_full_tier_cost_4aefb9a.txt (tier_cost.sh's output)
#     RUNS         docs/results/tokenize-full-runs
#     FIGURES      1,sharp,15,12,8,19,7,5,10,11 (the order the tier's queues have run them in)
#
# Prints one line per figure: its planned runs, the runs finished, the runs left that no earlier
# figure counted, and their CPU hours; then the totals.
set -u
bin=$(readlink -f "${1:-build/specmoe}")
cost=${2:-docs/results/tokenize_full_tier_cost_4aefb9a.txt}
runs=${3:-docs/results/tokenize-full-runs}
figs=${4:-1,sharp,15,12,8,19,7,5,10,11}
[ -x "$bin" ] || { echo "tier_left.sh: $bin is not an executable" >&2; exit 2; }
[ -r "$cost" ] || { echo "tier_left.sh: cannot read the cost table $cost" >&2; exit 2; }
[ -d "$runs" ] || { echo "tier_left.sh: $runs is not a directory" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/counted"
printf '%-8s %8s %9s %10s %12s\n' figure planned finished "runs left" "CPU hours"
for f in ${figs//,/ }; do
    # the figure's runs as <agent>-<encoder>/<variant>/<game>-s<seed>
    if ! "$bin" bench tokenize --tier full --dry-run --figures "$f" --out "$tmp/plan" > "$tmp/plan.txt"; then
        echo "tier_left.sh: bench tokenize --dry-run --figures $f failed" >&2
        exit 1
    fi
    grep -v '^bench-tokenize' "$tmp/plan.txt" | sed -n "s#.*--out $tmp/plan/\([^ ]*\).*#\1#p" > "$tmp/fig.txt"
    while read -r r; do
        if [ -e "$runs/$r/done" ]; then echo "done $r"; else echo "left $r"; fi
    done < "$tmp/fig.txt" > "$tmp/state.txt"
    awk -v fig="$f" -v counted="$tmp/counted" '
        FNR == NR { if (FNR > 1) price[$1] = $NF; next }      # the cost table: agent-variant ... CPU-h per run
        FILENAME == counted { seen[$1] = 1; next }
        {
            planned++
            if ($1 == "done") { finished++; next }
            if ($2 in seen) next
            split($2, p, "/"); agent = p[1]; sub(/-[^-]*$/, "", agent)
            key = agent "-" p[2]
            if (!(key in price)) { twin = key; sub(/-t[0-9.]*$/, "", twin); if (twin in price) key = twin }
            left++
            if (key in price) hours += price[key]; else unpriced = unpriced " " key
            print $2 > (counted ".new")
        }
        END {
            printf "%-8s %8d %9d %10d %12.1f%s\n", fig, planned, finished, left, hours, unpriced == "" ? "" : "  ? unpriced:" unpriced
        }' "$cost" "$tmp/counted" "$tmp/state.txt"
    [ -e "$tmp/counted.new" ] && { cat "$tmp/counted.new" >> "$tmp/counted"; rm -f "$tmp/counted.new"; }
done > "$tmp/table.txt"
cat "$tmp/table.txt"
awk '{ l += $4; h += $5 } END { printf "tier-left runs=%d cpu_hours=%.1f (two cores: about %.0f hours)\n", l, h, h / 2 }' "$tmp/table.txt"
