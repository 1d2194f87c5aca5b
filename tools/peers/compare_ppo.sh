#!/usr/bin/env bash
# PPO on the cheetah run task: specmoe vs a PyTorch peer of the same agent on the SAME C environment
# (tools/peers/ppo_cheetah.py steps envs/mujoco/cheetah.c through ctypes on build/libspecmoe.so),
# one thread each, runs alternated ABAB so that a neighbour's load falls on both sides alike; prints
# each run, then medians of wall-clock steps/s and CPU microseconds per step, and the ratios.
#
# Per round, in this order:
#   A  build/specmoe rl train --env mujoco/cheetah-run --agent ppo --frames N --threads 1 --out DIR
#      (SPS as it prints it; CPU = user + system of the process from /usr/bin/time, start-up and
#      the checkpoint included: a few ms)
#   B  /usr/bin/python3 tools/peers/ppo_cheetah.py --frames N (times its training loop, wall and
#      process CPU clock; interpreter start-up and torch import excluded), with its cost split:
#      env_s = wall inside the ctypes sm_vecenv_step call, act_s = the rest of the rollout (obs and
#      reward normalisation, actor/critic forward, sampling), learn_s = GAE + 10 x 32 minibatch updates
# CPU time per step is the figure that a neighbour's load barely moves; wall-clock SPS is not.
#
# Usage: tools/peers/compare_ppo.sh [--frames N] [--reps R] [--bin PATH] [--python PATH]
#   --frames N   steps per run, a multiple of 2048 (default 102400 = 50 updates)
#   --reps R     rounds (default 3)
#   --bin PATH   specmoe binary (default build/specmoe; the peer loads libspecmoe.so beside it)
#   --python P   interpreter with torch (default /usr/bin/python3, Debian's)
# Run from the repo root after `make`.
set -euo pipefail

frames=102400
reps=3
bin=build/specmoe
python=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "compare_ppo: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
    --frames) [ $# -ge 2 ] || die "--frames needs a value"; frames=$2; shift 2 ;;
    --reps) [ $# -ge 2 ] || die "--reps needs a value"; reps=$2; shift 2 ;;
    --bin) [ $# -ge 2 ] || die "--bin needs a value"; bin=$2; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs a value"; python=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$frames" in ''|*[!0-9]*) die "--frames must be an integer (got '$frames')" ;; esac
[ $((frames % 2048)) -eq 0 ] && [ "$frames" -gt 0 ] || die "--frames must be a positive multiple of 2048 (got $frames)"
case "$reps" in ''|*[!0-9]*|0) die "--reps must be a positive integer (got '$reps')" ;; esac
[ -x "$bin" ] || die "$bin: not found or not executable (run make first)"
lib=$(dirname "$bin")/libspecmoe.so
[ -f "$lib" ] || die "$lib: not found (run make first)"
[ -x /usr/bin/time ] || die "/usr/bin/time is needed for the CPU time of specmoe's runs"
"$python" -c 'import torch' 2>/dev/null || die "$python: cannot import torch (use Debian's /usr/bin/python3)"

tmp=$(mktemp -d /tmp/specmoe-ppo-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
calc() { awk "BEGIN {printf \"%.${2:-1}f\", $1}"; }

c_cmd=("$bin" rl train --env mujoco/cheetah-run --agent ppo --threads 1 --frames "$frames")
p_cmd=("$python" "$here/ppo_cheetah.py" --lib "$lib" --frames "$frames")
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# A: ${c_cmd[*]} --out DIR"
echo "# B: ${p_cmd[*]}"
"${p_cmd[@]:0:2}" --lib "$lib" --check | sed 's/^/# /' || die "the peer's binding check failed"

: >"$tmp/rows"
for r in $(seq 1 "$reps"); do
    out=$tmp/run-$r
    /usr/bin/time -f "cpu %U %S" -o "$tmp/time" "${c_cmd[@]}" --out "$out" >"$tmp/out" 2>"$tmp/err" ||
        { cat "$tmp/err" >&2; die "specmoe rl train failed"; }
    line=$(grep '^rl-train ' "$tmp/out") || die "no rl-train line from specmoe"
    A_sps=$(field "$line" SPS)
    A_cpu=$(awk '/^cpu/ {printf "%.3f", $2 + $3}' "$tmp/time")
    A_cpus=$(calc "1e6 * $A_cpu / $frames" 1)
    rm -rf "$out"
    echo "round $r A specmoe SPS=$A_sps cpu_s=$A_cpu cpu_us_per_step=$A_cpus episodes=$(field "$line" episodes) final_return=$(field "$line" final_return) load=$(cut -d' ' -f1 /proc/loadavg)"
    line=$("${p_cmd[@]}" 2>"$tmp/err" | grep '^peer-ppo ') || { cat "$tmp/err" >&2; die "the peer failed"; }
    B_sps=$(field "$line" SPS) B_cpus=$(field "$line" cpu_us_per_step)
    echo "round $r B pytorch ${line#peer-ppo } load=$(cut -d' ' -f1 /proc/loadavg)"
    echo "$A_sps $B_sps $A_cpus $B_cpus $(field "$line" env_s) $(field "$line" env_cpu_s) $(field "$line" act_s) $(field "$line" learn_s) $(field "$line" seconds) $(field "$line" learn_cpu_s) $(field "$line" cpu_s)" >>"$tmp/rows"
done
col() { awk -v c="$1" '{print $c}' "$tmp/rows" | median; }
a_sps=$(col 1) b_sps=$(col 2) a_cpus=$(col 3) b_cpus=$(col 4)
echo "compare-ppo frames=$frames reps=$reps specmoe_SPS=$a_sps pytorch_SPS=$b_sps ratio_SPS=$(calc "$a_sps / $b_sps" 2)" \
     "specmoe_cpu_us_per_step=$a_cpus pytorch_cpu_us_per_step=$b_cpus ratio_cpu=$(calc "$b_cpus / $a_cpus" 2)"
echo "compare-ppo-peer-split (medians) seconds=$(col 9) env_s=$(col 5) env_cpu_s=$(col 6) act_s=$(col 7) learn_s=$(col 8)" \
     "cpu_s=$(col 11) learn_cpu_s=$(col 10) env_us_per_step=$(calc "1e6 * $(col 5) / $frames" 1)" \
     "act_us_per_step=$(calc "1e6 * $(col 7) / $frames" 1) learn_us_per_step=$(calc "1e6 * $(col 8) / $frames" 1)" \
     "env_share=$(calc "$(col 5) / $(col 9)" 3)"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) load average $(cut -d' ' -f1-3 /proc/loadavg)"
