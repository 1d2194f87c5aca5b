#!/usr/bin/env bash
# specmoe vs PyTorch on the same MoE layer shapes, same thread count, one run.
#
# Runs `build/specmoe bench layer --threads N`, takes the shapes it reports, runs the PyTorch peer
# (tools/bench_peer.py, HF-Mixtral-style layer + Adam) on exactly those shapes, and prints one row
# per shape: tokens/s of both, the ratio specmoe / pytorch (> 1: specmoe is faster) and the ceiling:
# the largest ratio any fp32 implementation could reach against this PyTorch run on this machine
# (specmoe's max_tokens_per_s, the expert GEMMs' FLOPs at the measured multiply-add peak, over
# PyTorch's tokens/s), then the geometric mean of the ratios. Fields are read by name (T= d= h= E= k= tokens_per_s=) from the
# lines `bench-layer ...` and `bench-peer ...`, so their order and any extra fields do not matter.
#
# Usage: tools/bench_compare.sh [--threads N] [--seconds S] [--bin PATH] [--python PATH]
#   --threads N   threads for both sides (default: $THREADS or 2)
#   --seconds S   minimum timed seconds per shape, given to both sides (default: each side's, 1 s)
#   --bin PATH    specmoe binary (default build/specmoe)
#   --python PATH interpreter with torch (default /usr/bin/python3, Debian's; not the pyenv one)
# Run from the repo root (make bench-peer does).
set -euo pipefail

threads=${THREADS:-2}
seconds=
bin=build/specmoe
python=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "bench_compare: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) [ $# -ge 2 ] || die "--threads needs a value"; threads=$2; shift 2 ;;
    --seconds) [ $# -ge 2 ] || die "--seconds needs a value"; seconds=$2; shift 2 ;;
    --bin) [ $# -ge 2 ] || die "--bin needs a value"; bin=$2; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs a value"; python=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$threads" in ''|*[!0-9]*|0) die "--threads must be a positive integer (got '$threads')" ;; esac
[ -x "$bin" ] || die "$bin: not found or not executable (run make first)"
"$python" -c 'import torch' 2>/dev/null || die "$python: cannot import torch (use Debian's /usr/bin/python3)"

tmp=$(mktemp -d /tmp/specmoe-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# a command line as one would type it (arguments with shell characters in single quotes)
show() { for a; do case "$a" in *[!A-Za-z0-9_./=:,+-]*) printf "'%s' " "$a" ;; *) printf '%s ' "$a" ;; esac; done; }
# key=value field of a line, by name
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }

c_cmd=("$bin" bench layer --threads "$threads" ${seconds:+--seconds "$seconds"})
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# specmoe: $(show "${c_cmd[@]}")"
"${c_cmd[@]}" >"$tmp/c.out" 2>"$tmp/c.err" || { cat "$tmp/c.err" >&2; die "'${c_cmd[*]}' failed"; }
grep '^bench-layer ' "$tmp/c.out" >"$tmp/c.lines" || die "'${c_cmd[*]}' printed no 'bench-layer' line"

shapes=""
while IFS= read -r line; do
    s="$(field "$line" T),$(field "$line" d),$(field "$line" h),$(field "$line" E),$(field "$line" k)"
    case "$s" in *,,*|,*|*,) die "cannot read T,d,h,E,k from: $line" ;; esac
    shapes="${shapes:+$shapes;}$s"
done <"$tmp/c.lines"

py_cmd=("$python" "$here/bench_peer.py" --threads "$threads" ${seconds:+--seconds "$seconds"} --shapes "$shapes")
echo "# pytorch: $(show "${py_cmd[@]}")"
"${py_cmd[@]}" \
    >"$tmp/py.out" 2>"$tmp/py.err" || { cat "$tmp/py.err" >&2; die "bench_peer.py failed"; }
grep '^#' "$tmp/py.err" || true   # torch / OpenBLAS threads in use, cpu/wall per shape

grep '^bench-peak ' "$tmp/c.out" | sed 's/^/# /' || true
printf '%-6s %-5s %-6s %-4s %-3s %14s %14s %9s %9s\n' T d h E k specmoe_tok/s pytorch_tok/s ratio ceiling
logsum=0; n=0
while IFS= read -r line; do
    T=$(field "$line" T); d=$(field "$line" d); h=$(field "$line" h); E=$(field "$line" E); k=$(field "$line" k)
    c_tps=$(field "$line" tokens_per_s)
    p_tps=""
    while IFS= read -r pl; do
        if [ "$(field "$pl" T)" = "$T" ] && [ "$(field "$pl" d)" = "$d" ] && [ "$(field "$pl" h)" = "$h" ] &&
           [ "$(field "$pl" E)" = "$E" ] && [ "$(field "$pl" k)" = "$k" ]; then
            p_tps=$(field "$pl" tokens_per_s)
            break
        fi
    done < <(grep '^bench-peer ' "$tmp/py.out")
    if [ -z "$c_tps" ] || [ -z "$p_tps" ]; then
        printf '%-6s %-5s %-6s %-4s %-3s %14s %14s %9s %9s\n' "$T" "$d" "$h" "$E" "$k" "${c_tps:-?}" "${p_tps:-?}" "-" "-"
        continue
    fi
    ratio=$(awk -v a="$c_tps" -v b="$p_tps" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    max_tps=$(field "$line" max_tokens_per_s)
    ceiling=$(awk -v a="${max_tps:-0}" -v b="$p_tps" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else printf "-" }')
    printf '%-6s %-5s %-6s %-4s %-3s %14.0f %14.0f %9s %9s\n' "$T" "$d" "$h" "$E" "$k" "$c_tps" "$p_tps" "$ratio" "$ceiling"
    if awk -v a="$c_tps" -v b="$p_tps" 'BEGIN { exit !(a > 0 && b > 0) }'; then
        logsum=$(awk -v s="$logsum" -v a="$c_tps" -v b="$p_tps" 'BEGIN { printf "%.12g", s + log(a / b) }')
        n=$((n + 1))
    fi
done <"$tmp/c.lines"
if [ "$n" -gt 0 ]; then
    awk -v s="$logsum" -v n="$n" -v t="$threads" \
        'BEGIN { printf "geometric mean specmoe/pytorch over %d shapes, %d threads: %.2f\n", n, t, exp(s / n) }'
fi
