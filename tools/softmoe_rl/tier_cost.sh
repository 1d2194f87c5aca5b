#!/bin/bash
# The CPU cost of `bench tokenize --tier full`, measured: every distinct (agent, variant) of the
# tier runs 22,000 frames of Breakout (seed 1, one thread) with learning from frame 2,000 and
# epsilon at 0.01 throughout (the greedy regime of most of a 1M-frame run), so 20,000 frames of
# it learn: 5,000 updates for DQN and Rainbow-lite (an update every 4 frames), 20,000 for DER. The CPU time
# (user + system) per frame, times the run's frames in the tier (1M; DER 250k) and its 15 games and seeds, is the tier's cost;
# the random warm-up (20,000 frames of Rainbow's 1M) costs less than a learning frame, so it errs high.
#
#   tools/softmoe_rl/tier_cost.sh [BINARY] [SCRATCH_DIR]     (BINARY: build/specmoe)
#   TC_FRAMES=2200 tools/softmoe_rl/tier_cost.sh              (a smoke test of the script: 10x shorter)
#   TC_BENCH_FLAGS="--figures 1 --encoder impala" tools/softmoe_rl/tier_cost.sh
#                                                  (only the plan of these `bench tokenize` flags)
#
# Prints one line per (agent, variant): CPU seconds, frames per CPU second, CPU hours per run of the tier;
# then the tier's total in CPU hours.
set -u
F=${TC_FRAMES:-22000}
read -r -a extra <<< "${TC_BENCH_FLAGS:-}"
bin=$(readlink -f "${1:-build/specmoe}")
tmp=${2:-$(mktemp -d)}
mkdir -p "$tmp"
"$bin" bench tokenize --tier full --dry-run ${extra[@]+"${extra[@]}"} --games breakout --seeds 1 --out "$tmp/plan" | grep -v '^bench-tokenize' > "$tmp/plan.txt" || exit 1
header=$("$bin" bench tokenize --tier full --dry-run ${extra[@]+"${extra[@]}"} --out "$tmp/plan" | grep '^bench-tokenize tier')
seeds=$(echo "$header" | sed -n 's/.* seeds=\([0-9]*\) .*/\1/p')
games=$(echo "$header" | sed -n 's/.* games=\([^ ]*\) .*/\1/p' | tr ',' '\n' | wc -l)
games_seeds=$((games * seeds))
total=0
printf '%-34s %9s %14s %18s\n' "agent-variant" "CPU s" "frames/CPU s" "CPU h per run"
while read -r line; do
    agent=$(echo "$line" | sed 's/.*--agent \([^ ]*\).*/\1/')
    variant=$(echo "$line" | sed 's/.*--out [^ ]*\/\([^/ ]*\)\/breakout-s1 .*/\1/')
    name=$agent-$variant
    # the run's own flags, with the frame budget, the checkpoints, the reset and pruning frames scaled
    # from the tier's frames to F
    full=$(echo "$line" | sed -n 's/.*--frames \([0-9]*\).*/\1/p')
    scale() { echo "$line" | sed -n "s/.*--$1 \([0-9]*\).*/\1/p" | awk -v f="$F" -v t="$full" '{ printf "%d", $1 * f / t }'; }
    args=$(echo "$line" | sed 's/^[^ ]* //; s/--frames [0-9]*/--frames '$F'/; s/--ckpt-every [0-9]*/--ckpt-every 0/;
        s/--reset-every [0-9]*/--reset-every '"$(scale reset-every)"'/; s/--prune-from [0-9]*/--prune-from '"$(scale prune-from)"'/;
        s/--prune-to [0-9]*/--prune-to '"$(scale prune-to)"'/' |
        sed "s#--out [^ ]*#--out $tmp/$name#")
    rm -rf "${tmp:?}/$name"
    # shellcheck disable=SC2086
    /usr/bin/time -f "%U %S" -o "$tmp/time.txt" "$bin" $args --learning-starts $((F / 11)) --eps-start 0.01 --eps-end 0.01 --save-replay 0 \
        < /dev/null > "$tmp/$name.log" 2>&1 || { echo "$name: the run failed, see $tmp/$name.log"; exit 1; }
    read -r u s < "$tmp/time.txt"
    line_out=$(awk -v n="$name" -v u="$u" -v s="$s" -v f="$F" -v T="$full" 'BEGIN { c = u + s + 1e-9; printf "%-34s %9.2f %14.0f %18.2f", n, c, f / c, c / f * T / 3600 }')
    echo "$line_out"
    total=$(awk -v t="$total" -v u="$u" -v s="$s" -v k="$games_seeds" -v f="$F" -v T="$full" 'BEGIN { printf "%.1f", t + (u + s) / f * T * k }')
done < "$tmp/plan.txt"
awk -v t="$total" -v k="$games_seeds" -v x="${TC_BENCH_FLAGS:-}" 'BEGIN { printf "tier-cost cpu_hours=%.0f (every run above x %d games and seeds, at the tier frames per run%s)\n", t / 3600, k, x == "" ? "" : "; the plan of " x }'
