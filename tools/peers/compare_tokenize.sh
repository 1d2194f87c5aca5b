#!/usr/bin/env bash
# The DQN update of the Fig. 1 networks of `specmoe bench tokenize` (issue 14: the flattened
# baseline, its penultimate layer scaled 4x, SoftMoE-4, SoftMoE-1 with its expert scaled 4x,
# ExpertChoice-1 x4) in specmoe and in PyTorch, CPU time per update and the fraction of the one-core
# FMA peak, as ratios from one run. Per round and network, in this order:
#   A  build/dqn_update --seconds S --sample 0 --obs env FLAGS   (tools/peers/dqn_update.c; FLAGS are
#      the network's flags in the full tier's plan, `bench tokenize --tier full --dry-run`)
#   B  /usr/bin/python3 tools/peers/dqn_minatar.py --update-only --seconds S --obs env --net NAME
#      (the same network written as a PyTorch user would, batched over observations; one thread)
#   C  B with glibc's allocator kept from returning memory to the system (MALLOC_MMAP_THRESHOLD_ and
#      MALLOC_TRIM_THRESHOLD_ at 1 GB). By default glibc hands torch's large tensors back to the
#      kernel when they are freed and takes them again, page fault by page fault, on the next update:
#      on this machine that was most of SoftMoE-1 x4's update (81 ms with 776k minor faults, 10 ms
#      with the allocator tuned). C is PyTorch without that cost; B is what a user gets by default.
# Both sides: batch 32, a target forward on the next states, an online forward and backward, the
# Huber loss and a centered RMSprop step, on 16 fixed batches of Breakout frames under a random
# policy; no replay sampling. The two networks must have the same parameter count (checked here;
# that they compute the same function, forward and backward, is `dqn_minatar.py --check`'s). FLOPs
# are specmoe's count of the network (sm_model_update_macs), so both fractions divide the same work.
# Prints each run, then per network the medians over rounds and pytorch / specmoe for B and C.
#
# Usage: tools/peers/compare_tokenize.sh [--seconds S] [--reps R] [--nets LIST] [--python PATH]
#   --seconds S   timed seconds of each run (default 2)
#   --reps R      rounds (default 3)
#   --nets LIST   comma list (default baseline,baseline-x4,softmoe-4,softmoe-1-x4,expert-choice-1-x4)
#   --python P    interpreter with torch (default /usr/bin/python3, Debian's python3-torch)
# Run from the repository's root; it builds build/dqn_update and build/specmoe.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=2 reps=3 python=/usr/bin/python3
nets=baseline,baseline-x4,softmoe-4,softmoe-1-x4,expert-choice-1-x4
die() { echo "compare_tokenize: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "$1 needs a value (see the header of $0)"
    case "$1" in
    --seconds) secs=$2 ;;
    --reps) reps=$2 ;;
    --nets) nets=$2 ;;
    --python) python=$2 ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
    shift 2
done
case "$reps" in ''|*[!0-9]*|0) die "--reps must be a positive integer (got '$reps')" ;; esac
"$python" -c 'import torch' 2>/dev/null || die "$python: cannot import torch (Debian's python3-torch: scripts/setup.sh)"
make -s build/dqn_update build/specmoe

# shellcheck source=tools/peers/tokenize_common.sh
. tools/peers/tokenize_common.sh
plan=$(tokenize_plan "" --figures 1) # each network's flags in the full tier's plan

tmp=$(mktemp -d /tmp/specmoe-tokenize-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
IFS=, read -r -a list <<<"$nets"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$reps"); do
    for net in "${list[@]}"; do
        flags=$(awk -v n="$net" '$1 == n {$1 = ""; print substr($0, 2)}' <<<"$plan")
        [ -n "$flags" ] || die "no network '$net' in the plan of bench tokenize's Fig. 1"
        # shellcheck disable=SC2086
        out=$(build/dqn_update --seconds "$secs" --sample 0 --obs env $flags)
        a=$(grep '^dqn-update ' <<<"$out") pk=$(grep '^bench-peak ' <<<"$out")
        peer=("$python" tools/peers/dqn_minatar.py --update-only --seconds "$secs" --obs env --net "$net")
        b=$("${peer[@]}" 2>"$tmp/err" | grep '^peer-dqn-update ') ||
            die "the PyTorch peer failed on $net: $(tail -n 3 "$tmp/err")"
        c=$(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 "${peer[@]}" 2>"$tmp/err" |
            grep '^peer-dqn-update ') || die "the PyTorch peer failed on $net (allocator tuned): $(tail -n 3 "$tmp/err")"
        [ "$(field "$a" params)" = "$(field "$b" params)" ] ||
            die "$net: specmoe has $(field "$a" params) parameters, the PyTorch network $(field "$b" params)"
        echo "round $r $net A $a"
        echo "round $r $net B $b"
        echo "round $r $net C $c"
        echo "$net $(field "$a" cpu_us_per_update) $(field "$b" cpu_us_per_update) $(field "$c" cpu_us_per_update)" \
             "$(field "$a" mflop) $(field "$pk" peak_gflops_per_cpu_s)" >>"$tmp/rows"
    done
done
for net in "${list[@]}"; do
    col() { awk -v n="$net" -v c="$1" '$1 == n {print $c}' "$tmp/rows" | median; }
    a=$(col 2) b=$(col 3) c=$(col 4) mflop=$(col 5) peak=$(col 6)
    frac() { calc "$mflop * 1e3 / $1 / $peak" 4; }
    echo "compare-tokenize net=$net mflop=$mflop specmoe_cpu_us=$a pytorch_cpu_us=$b pytorch_tuned_cpu_us=$c" \
         "ratio_cpu=$(calc "$b / $a" 2) ratio_cpu_tuned=$(calc "$c / $a" 2) specmoe_cpu_roofline_fraction=$(frac "$a")" \
         "pytorch_cpu_roofline_fraction=$(frac "$b") pytorch_tuned_cpu_roofline_fraction=$(frac "$c") peak_gflops_per_cpu_s=$peak"
done
