#!/usr/bin/env bash
# DQN on MinAtar Breakout, MinAtar's settings: specmoe vs a PyTorch peer of the same agent and game
# (tools/peers/dqn_minatar.py), one thread each, runs alternated ABAB so that a neighbour's load
# falls on both sides alike; prints each run, then medians and the ratios specmoe / PyTorch.
#
# Per round, in this order:
#   A  build/specmoe rl train --env minatar/breakout --agent dqn --preset minatar --frames N
#      --threads 1 --save-replay 0 (the peer writes no checkpoint, so neither writes the replay),
#      and the same with --frames 5000 (the random warm-up alone: the learning phase of A is the
#      difference of the two, wall and CPU); CPU = user + system of the process (/usr/bin/time)
#   B  /usr/bin/python3 tools/peers/dqn_minatar.py --frames N (times the warm-up and the learning
#      phase itself; CPU = its process clock over the loop, interpreter start-up excluded)
# then the update alone, alternated the same way:
#   A  build/dqn_update (tools/peers/dqn_update.c: the same update through the public API, with its
#      FLOPs against the FMA peak `specmoe bench layer` measures)
#   B  dqn_minatar.py --update-only
# SPS counts every frame of the run (warm-up included), as `specmoe rl train` prints it; learn_SPS
# and learn CPU us/frame count the frames after the 5000-frame warm-up (one update each). The
# compare-dqn line divides the two sides' medians; compare-dqn-paired takes each round's ratio and
# their median (the figure to quote when the machine's speed drifts from round to round);
# compare-dqn-best divides the two sides' fastest learning frames.
# CPU time per frame is the figure that a neighbour's load barely moves; wall-clock SPS is not.
#
# --side-by-side runs each round's two sides at once, B pinned to the second core and A on the first,
# A's pair of runs repeated until B ends (A's figure: the median of its repeats). Both then see the
# same machine at the same moments: on a shared host whose speed drifts over tens of seconds (the
# 2-core VMs these benchmarks run on: one side's run alone moved 380 -> 530 us per frame between
# consecutive rounds) the ratio of a round then compares like with like. Needs 2 free cores (taskset).
#
# Usage: tools/peers/compare_dqn.sh [--frames N] [--reps R] [--eps E] [--update-seconds S]
#                                   [--side-by-side] [--bin PATH] [--python PATH]
#   --frames N          frames per run, warm-up included (default 20000)
#   --reps R            rounds (default 3)
#   --eps E             a fixed exploration rate after the warm-up on both sides (default: the
#                       preset's 1 -> 0.1 over 100k frames; 0.1 is the regime of frames > 105k,
#                       where most frames also run a batch-1 forward to act greedily)
#   --update-seconds S  timed seconds of each update-only run (default 3; 0 skips them)
#   --side-by-side      run A and B of a round at the same time, one core each (see above)
#   --bin PATH          specmoe binary (default build/specmoe)
#   --python PATH       interpreter with torch (default /usr/bin/python3, Debian's)
# Run from the repo root after `make`.
set -euo pipefail

frames=20000
reps=3
eps=
useconds=3
bin=build/specmoe
python=/usr/bin/python3
side=0
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "compare_dqn: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
    --frames) [ $# -ge 2 ] || die "--frames needs a value"; frames=$2; shift 2 ;;
    --reps) [ $# -ge 2 ] || die "--reps needs a value"; reps=$2; shift 2 ;;
    --eps) [ $# -ge 2 ] || die "--eps needs a value"; eps=$2; shift 2 ;;
    --update-seconds) [ $# -ge 2 ] || die "--update-seconds needs a value"; useconds=$2; shift 2 ;;
    --bin) [ $# -ge 2 ] || die "--bin needs a value"; bin=$2; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs a value"; python=$2; shift 2 ;;
    --side-by-side) side=1; shift ;;
    -h|--help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$frames" in ''|*[!0-9]*) die "--frames must be an integer (got '$frames')" ;; esac
[ "$frames" -gt 5000 ] || die "--frames must exceed the 5000-frame warm-up (got $frames)"
case "$reps" in ''|*[!0-9]*|0) die "--reps must be a positive integer (got '$reps')" ;; esac
[ -x "$bin" ] || die "$bin: not found or not executable (run make first)"
[ -x /usr/bin/time ] || die "/usr/bin/time is needed for the CPU time of specmoe's runs"
a_pre=() # A's command prefix: pinned to the first core beside B
if [ "$side" = 1 ]; then
    a_pre=(taskset -c 0)
    command -v taskset >/dev/null 2>&1 || die "--side-by-side needs taskset (util-linux)"
    [ "$(nproc)" -ge 2 ] || die "--side-by-side needs 2 cores"
fi
"$python" -c 'import torch' 2>/dev/null || die "$python: cannot import torch (use Debian's /usr/bin/python3)"

# the update-only benchmark: the library, the FMA peak of bench layer, the Makefile's libraries
lib=$(dirname "$bin")/libspecmoe.a
ubin=$(dirname "$bin")/dqn_update
if [ "$useconds" != 0 ]; then
    [ -f "$lib" ] || die "$lib: not found (run make first)"
    if [ ! -x "$ubin" ] || [ "$here/dqn_update.c" -nt "$ubin" ] || [ "$lib" -nt "$ubin" ]; then
        blasdir=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/openblas-openmp
        blas=(-lopenblas)
        [ -d "$blasdir" ] && blas=(-L"$blasdir" -Wl,-rpath,"$blasdir" -lopenblas)
        # a library built with MPI (the Makefile's default when mpicc is there) needs MPI's link flags
        if command -v mpicc >/dev/null 2>&1; then read -r -a mpi <<<"$(mpicc --showme:link)"; blas+=("${mpi[@]}"); fi
        ${CC:-cc} -O3 -march=x86-64-v2 -mtune=native -std=c11 -Wall -Wextra -Werror -fopenmp -D_DEFAULT_SOURCE \
            -Iinclude -I. "$here/dqn_update.c" experiments/engine/peak.c "$lib" "${blas[@]}" -llapacke -lcjson -lmujoco -lz -lm \
            -o "$ubin" || die "building $ubin failed"
    fi
fi

tmp=$(mktemp -d /tmp/specmoe-dqn-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
calc() { awk "BEGIN {printf \"%.${2:-1}f\", $1}"; }

extra=()
peer_extra=()
if [ -n "$eps" ]; then
    extra=(--eps-start "$eps" --eps-end "$eps")
    peer_extra=(--eps-start "$eps" --eps-end "$eps")
fi
c_cmd=("$bin" rl train --env minatar/breakout --agent dqn --preset minatar --threads 1 --save-replay 0 "${extra[@]}")
p_cmd=("$python" "$here/dqn_minatar.py" "${peer_extra[@]}")
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# A: ${c_cmd[*]} --frames $frames (and --frames 5000) --out DIR"
echo "# B: ${p_cmd[*]} --frames $frames"

# ours: wall seconds, CPU seconds of one run (sets c_sps c_wall c_cpu)
run_ours() {
    local n=$1 out=$tmp/run-$1-$2
    /usr/bin/time -f "cpu %U %S" -o "$tmp/time" "${a_pre[@]}" "${c_cmd[@]}" --frames "$n" --out "$out" >"$tmp/out" 2>"$tmp/err" ||
        { cat "$tmp/err" >&2; die "specmoe rl train failed"; }
    local line
    line=$(grep '^rl-train ' "$tmp/out") || die "no rl-train line from specmoe"
    c_sps=$(field "$line" SPS)
    c_wall=$(calc "$n / $c_sps" 3)
    c_cpu=$(awk '/^cpu/ {printf "%.3f", $2 + $3}' "$tmp/time")
    rm -rf "$out"
}

: >"$tmp/rows"
# one measurement of A: a run of N frames and one of the 5000-frame warm-up (sets the A_* figures)
measure_ours() {
    run_ours "$frames" "$1"
    A_sps=$c_sps A_wall=$c_wall A_cpu=$c_cpu
    run_ours 5000 "$1"
    W_wall=$c_wall W_cpu=$c_cpu
    lf=$((frames - 5000))
    A_lsps=$(calc "$lf / ($A_wall - $W_wall)" 0)
    A_lcpu=$(calc "1e6 * ($A_cpu - $W_cpu) / $lf" 1)
    A_cpuf=$(calc "1e6 * $A_cpu / $frames" 1)
}

for r in $(seq 1 "$reps"); do
    if [ "$side" = 1 ]; then
        # B on the second core in the background, A's measurements on the first until B ends
        taskset -c 1 "${p_cmd[@]}" --frames "$frames" >"$tmp/peer" 2>"$tmp/err" &
        bpid=$!
        : >"$tmp/arows"
        while :; do
            measure_ours "$r"
            echo "$A_sps $A_cpuf $A_lsps $A_lcpu $W_wall $W_cpu" >>"$tmp/arows"
            kill -0 "$bpid" 2>/dev/null || break
        done
        wait "$bpid" || { cat "$tmp/err" >&2; die "the peer failed"; }
        na=$(wc -l <"$tmp/arows")
        acol() { awk -v c="$1" '{print $c}' "$tmp/arows" | median; }
        A_sps=$(acol 1) A_cpuf=$(acol 2) A_lsps=$(acol 3) A_lcpu=$(acol 4) W_wall=$(acol 5) W_cpu=$(acol 6)
        echo "round $r A specmoe SPS=$A_sps cpu_us_per_frame=$A_cpuf learn_SPS=$A_lsps learn_cpu_us_per_frame=$A_lcpu (medians of $na runs beside B; learn_cpu_us_per_frame each: $(awk '{printf "%s ", $4}' "$tmp/arows"))"
        line=$(grep '^peer-dqn ' "$tmp/peer") || { cat "$tmp/err" >&2; die "the peer failed"; }
    else
        measure_ours "$r"
        echo "round $r A specmoe SPS=$A_sps cpu_us_per_frame=$A_cpuf learn_SPS=$A_lsps learn_cpu_us_per_frame=$A_lcpu (warm-up alone: $W_wall s wall, $W_cpu s CPU)"
        line=$("${p_cmd[@]}" --frames "$frames" 2>"$tmp/err" | grep '^peer-dqn ') || { cat "$tmp/err" >&2; die "the peer failed"; }
    fi
    B_sps=$(field "$line" SPS) B_cpuf=$(field "$line" cpu_us_per_frame)
    B_lsps=$(field "$line" learn_SPS) B_lcpu=$(field "$line" learn_cpu_us_per_frame)
    echo "round $r B pytorch SPS=$B_sps cpu_us_per_frame=$B_cpuf learn_SPS=$B_lsps learn_cpu_us_per_frame=$B_lcpu warmup_SPS=$(field "$line" warmup_SPS) mean_return=$(field "$line" mean_return)"
    echo "$A_sps $B_sps $A_cpuf $B_cpuf $A_lsps $B_lsps $A_lcpu $B_lcpu" >>"$tmp/rows"
done
col() { awk -v c="$1" '{print $c}' "$tmp/rows" | median; }
# the ratio of each round's own pair (B over A for costs, A over B for rates), then their median: the
# machine's speed drifts between rounds (both sides slow down together), and a ratio of the two
# sides' medians can pair one side's fast round with the other's slow one
pcol() { awk -v a="$1" -v b="$2" '{print $b / $a}' "$tmp/rows" | median; }
a_sps=$(col 1) b_sps=$(col 2) a_cpuf=$(col 3) b_cpuf=$(col 4) a_lsps=$(col 5) b_lsps=$(col 6) a_lcpu=$(col 7) b_lcpu=$(col 8)
echo "compare-dqn-paired reps=$reps ratio_SPS=$(calc "$(pcol 2 1)" 2) ratio_cpu=$(calc "$(pcol 3 4)" 2)" \
     "learn_ratio_SPS=$(calc "$(pcol 6 5)" 2) learn_ratio_cpu=$(calc "$(pcol 7 8)" 2)" \
     "learn_ratio_cpu_range=$(awk '{print $8 / $7}' "$tmp/rows" | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.2f-%.2f", lo, hi}')"
echo "compare-dqn frames=$frames reps=$reps${eps:+ eps=$eps} specmoe_SPS=$a_sps pytorch_SPS=$b_sps ratio_SPS=$(calc "$a_sps / $b_sps" 2)" \
     "specmoe_cpu_us_per_frame=$a_cpuf pytorch_cpu_us_per_frame=$b_cpuf ratio_cpu=$(calc "$b_cpuf / $a_cpuf" 2)"
echo "compare-dqn-learn frames=$((frames - 5000)) specmoe_learn_SPS=$a_lsps pytorch_learn_SPS=$b_lsps ratio_SPS=$(calc "$a_lsps / $b_lsps" 2)" \
     "specmoe_learn_cpu_us_per_frame=$a_lcpu pytorch_learn_cpu_us_per_frame=$b_lcpu ratio_cpu=$(calc "$b_lcpu / $a_lcpu" 2)"
# each side's fastest round against the other's: the ratio when both run at their best (a round of
# ours in one of the host's slow spells then no longer counts against it, nor PyTorch's against it)
mincol() { awk -v c="$1" '{print $c}' "$tmp/rows" | sort -g | head -1; }
a_best=$(mincol 7) b_best=$(mincol 8)
echo "compare-dqn-best specmoe_learn_cpu_us_per_frame=$a_best pytorch_learn_cpu_us_per_frame=$b_best ratio_cpu=$(calc "$b_best / $a_best" 2)"

[ "$useconds" = 0 ] && exit 0
echo "# A: $ubin --seconds $useconds; B: ${p_cmd[0]} $here/dqn_minatar.py --update-only --seconds $useconds"
: >"$tmp/urows"
for r in $(seq 1 "$reps"); do
    out=$("$ubin" --seconds "$useconds")
    pk=$(grep '^bench-peak ' <<<"$out") up=$(grep '^dqn-update ' <<<"$out")
    echo "round $r A $up"
    echo "round $r A $pk"
    line=$("$python" "$here/dqn_minatar.py" --update-only --seconds "$useconds" 2>/dev/null | grep '^peer-dqn-update ')
    echo "round $r B $line"
    echo "$(field "$up" us_per_update) $(field "$line" us_per_update) $(field "$up" cpu_us_per_update) $(field "$line" cpu_us_per_update)" \
         "$(field "$up" cpu_roofline_fraction) $(field "$up" roofline_fraction) $(field "$pk" peak_gflops_per_cpu_s) $(field "$pk" peak_gflops)" \
         "$(field "$up" mflop)" >>"$tmp/urows"
done
ucol() { awk -v c="$1" '{print $c}' "$tmp/urows" | median; }
mflop=$(ucol 9)
echo "compare-dqn-update batch=32 specmoe_us=$(ucol 1) pytorch_us=$(ucol 2) ratio=$(calc "$(ucol 2) / $(ucol 1)" 2)" \
     "specmoe_cpu_us=$(ucol 3) pytorch_cpu_us=$(ucol 4) ratio_cpu=$(calc "$(ucol 4) / $(ucol 3)" 2) mflop=$mflop" \
     "peak_gflops_per_cpu_s=$(ucol 7) specmoe_cpu_roofline_fraction=$(ucol 5)" \
     "pytorch_cpu_roofline_fraction=$(calc "$mflop * 1e3 / $(ucol 4) / $(ucol 7)" 4)" \
     "peak_gflops_wall=$(ucol 8) specmoe_wall_roofline_fraction=$(ucol 6)"
