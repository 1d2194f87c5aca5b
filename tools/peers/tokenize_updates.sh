#!/usr/bin/env bash
# Time and FLOP-count the update of every network of `specmoe bench tokenize` (issue 14: "frames/s of
# each agent variant and the fraction of the FLOP roofline of its update"). One line per variant:
# the DQN update (batch 32, two forwards and a backward, tools/peers/dqn_update.c) of that variant's
# network on MinAtar Breakout's 4 x 10 x 10 frames, CPU time per update, MFLOP per update
# (sm_model_update_macs) and the fraction of the one-core FMA peak per CPU second. The networks are
# those `specmoe bench tokenize --tier full --dry-run` plans for Rainbow-lite, read from its output.
# Usage: tools/peers/tokenize_updates.sh [SECONDS per variant, default 2]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-2}
make -s build/dqn_update build/specmoe
# the networks: every Rainbow-lite variant of the full tier's plan (`bench tokenize --dry-run`), its
# flags from --arch on; the reset and pruning variants are left out (their network is softmoe-4's)
# shellcheck source=tools/peers/tokenize_common.sh
. tools/peers/tokenize_common.sh
plan=$(tokenize_plan '--reset-every\|--prune-experts')
[ -n "$plan" ] || { echo "tokenize_updates: no variants in the plan" >&2; exit 1; }
while read -r name args; do
    # shellcheck disable=SC2086
    line=$(build/dqn_update --seconds "$secs" --obs env $args | tail -1)
    get() { field "$line" "$1"; }
    printf 'tokenize-update variant=%s mflop=%s cpu_us_per_update=%s cpu_gflops=%s cpu_roofline_fraction=%s\n' \
        "$name" "$(get mflop)" "$(get cpu_us_per_update)" "$(get cpu_gflops)" "$(get cpu_roofline_fraction)"
done <<< "$plan"
