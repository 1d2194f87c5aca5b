#!/usr/bin/env bash
# Issue 14's speed bar ("SoftMoE-4 must cost no more than 1.5x the flattened baseline's time per
# update") at each encoder of `specmoe bench tokenize`: MinAtar's single convolution (the study's),
# and the Nature-CNN and Impala-ResNet shapes scaled to 10 x 10 (the paper's Fig. 9 and its main
# encoder). Per round and encoder, the networks of --nets (the flattened baseline and SoftMoE-4) in
# turn, each network's flags from the full tier's plan (`bench tokenize --tier full --dry-run --figures 1 --encoder E`):
#   build/dqn_update --seconds S --sample 0 --obs env FLAGS
# (tools/peers/dqn_update.c: batch 32, a target forward on the next states, an online forward and
# backward, the Huber loss and a centered RMSprop step on 16 fixed batches of Breakout frames).
# Prints each run, then per encoder and network the median CPU us per update over the rounds, its
# MFLOP (sm_model_update_macs), the fraction of the one-core FMA peak, and two ratios to the first
# network of the same encoder: over_FIRST, the ratio of the two medians, and round_ratio_median /
# _min / _max, the ratio within each round (a slow spell of the host moves both networks of a round
# alike), its median and range over the rounds.
#
# Usage: tools/peers/tokenize_encoders.sh [--seconds S] [--reps R] [--encoders LIST] [--nets LIST] [--equal LIST]
#                                         [--build DIR] [--plan 1]
#   --seconds S     timed seconds of each run (default 2)
#   --reps R        rounds (default 5)
#   --encoders L    comma list (default minatar,nature,impala)
#   --nets L        comma list of Fig. 1 networks (default baseline,softmoe-4; the first is the ratios' base)
#   --build DIR     the directory of specmoe and dqn_update (default build, made first; another is used as it is)
#   --equal L       comma list, one expert hidden width per encoder: adds the network softmoe-4-eq,
#                   softmoe-4 with its experts that wide (moe:H for moe:128), to size SoftMoE-4 to the
#                   baseline's parameters ("at equal expert parameters": the summary prints params)
#   --plan 1        print "ENCODER NETWORK FLAGS" for each network and stop, timing nothing
set -euo pipefail
secs=2 reps=5 encoders=minatar,nature,impala nets=baseline,softmoe-4 build= plan_only=0 equal=
die() { echo "tokenize_encoders: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "$1 needs a value (see the header of $0)"
    case "$1" in
    --seconds) secs=$2 ;;
    --reps) reps=$2 ;;
    --encoders) encoders=$2 ;;
    --nets) nets=$2 ;;
    --build) build=$(cd "$2" 2>/dev/null && pwd) || die "--build $2: not a directory" ;;
    --plan) plan_only=$2 ;;
    --equal) equal=$2 ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
    shift 2
done
case "$reps" in ''|*[!0-9]*|0) die "--reps must be a positive integer (got '$reps')" ;; esac
cd "$(dirname "$0")/../.."
if [ -z "$build" ]; then make -s build/dqn_update build/specmoe; build=build; fi
[ -x "$build/specmoe" ] && [ -x "$build/dqn_update" ] || die "$build has no specmoe and dqn_update (make build/dqn_update)"
export TOKENIZE_SPECMOE=$build/specmoe

# shellcheck source=tools/peers/tokenize_common.sh
. tools/peers/tokenize_common.sh
IFS=, read -r -a encs <<<"$encoders"
IFS=, read -r -a list <<<"$nets"
for net in "${list[@]}"; do [ "$net" != softmoe-4-eq ] || die "softmoe-4-eq is not a network of --nets: --equal adds it"; done
[ -n "$equal" ] && list+=(softmoe-4-eq)
[ ${#encs[@]} -gt 0 ] || die "--encoders names no encoder"
[ ${#list[@]} -gt 0 ] || die "--nets names no network"
widths=()
if [ -n "$equal" ]; then
    IFS=, read -r -a widths <<<"$equal"
    [ ${#widths[@]} -eq ${#encs[@]} ] || die "--equal needs one width per encoder (${#encs[@]}), got '$equal'"
    for h in "${widths[@]}"; do case "$h" in ''|*[!0-9]*|0*) die "--equal: '$h' is not a positive width" ;; esac; done
fi
[ -z "$(printf '%s\n' "${encs[@]}" | sort | uniq -d)" ] || die "--encoders names an encoder twice ('$encoders')"
tmp=$(mktemp -d /tmp/specmoe-encoders-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for i in "${!encs[@]}"; do
    e=${encs[$i]}
    tokenize_plan "" --figures 1 --encoder "$e" >"$tmp/plan-$e"
    if [ ${#widths[@]} -gt 0 ]; then
        awk -v h="${widths[$i]}" '$1 == "softmoe-4" {$1 = "softmoe-4-eq"; if (!sub(/,moe:128,/, ",moe:" h ",")) exit 1; print}' \
            "$tmp/plan-$e" >"$tmp/eq" || die "softmoe-4's plan on $e has no moe:128"
        cat "$tmp/eq" >>"$tmp/plan-$e"
    fi
    for net in "${list[@]}"; do # every network is in every plan before anything is timed
        awk -v n="$net" '$1 == n {f = 1} END {exit !f}' "$tmp/plan-$e" ||
            die "no network '$net' in the plan of bench tokenize's Fig. 1 (encoder $e)"
    done
done
if [ "$plan_only" = 1 ]; then
    for e in "${encs[@]}"; do
        for net in "${list[@]}"; do awk -v e="$e" -v n="$net" '$1 == n {print e, $0}' "$tmp/plan-$e"; done
    done
    exit 0
fi
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$reps"); do
    for e in "${encs[@]}"; do
        for net in "${list[@]}"; do
            flags=$(awk -v n="$net" '$1 == n {$1 = ""; print substr($0, 2)}' "$tmp/plan-$e")
            # shellcheck disable=SC2086
            out=$("$build/dqn_update" --seconds "$secs" --sample 0 --obs env $flags)
            a=$(grep '^dqn-update ' <<<"$out") || die "$e $net: dqn_update printed no dqn-update line"
            pk=$(grep '^bench-peak ' <<<"$out") || die "$e $net: dqn_update printed no bench-peak line"
            echo "round $r $e $net $a"
            # one row per run: round encoder network us mflop peak params
            echo "$r $e $net $(field "$a" cpu_us_per_update) $(field "$a" mflop) $(field "$pk" peak_gflops_per_cpu_s) $(field "$a" params)" >>"$tmp/rows"
        done
    done
done
for e in "${encs[@]}"; do
    col() { awk -v e="$e" -v n="$1" -v c="$2" '$2 == e && $3 == n {print $c}' "$tmp/rows" | median; }
    base=$(col "${list[0]}" 4)
    for net in "${list[@]}"; do
        us=$(col "$net" 4) mflop=$(col "$net" 5) peak=$(col "$net" 6) params=$(col "$net" 7)
        # the ratio within each round (the host's slow spells move both networks of a round alike)
        ratios=$(awk -v e="$e" -v n="$net" -v b="${list[0]}" '$2 == e && $3 == b {t[$1] = $4}
            $2 == e && $3 == n {u[$1] = $4} END {for (r in u) printf "%.9g\n", u[r] / t[r]}' "$tmp/rows" | sort -g)
        echo "tokenize-encoder encoder=$e net=$net params=$params mflop=$mflop cpu_us_per_update=$us" \
             "cpu_roofline_fraction=$(calc "$mflop * 1e3 / $us / $peak" 3) over_${list[0]}=$(calc "$us / $base" 2)" \
             "round_ratio_median=$(calc "$(median <<<"$ratios")" 2) round_ratio_min=$(calc "$(head -n 1 <<<"$ratios")" 2)" \
             "round_ratio_max=$(calc "$(tail -n 1 <<<"$ratios")" 2)"
    done
done
