#!/bin/bash
# Starts the full tier of `bench tokenize` for a session: two queues (tier_queue.sh), one per core,
# over the runs not yet finished. Each session of the 2-core machine begins with this.
#
#   tools/softmoe_rl/tier_start.sh [--print] [BENCH_DIR]
#
# The binary is build/specmoe of this checkout (SPECMOE=PATH names another).
# BENCH_DIR (default /work/bench-runs) holds the bench's --out, BENCH_DIR/tokenize-full, and the
# queues' copy of the binary. Before it starts anything it:
#   - refuses when a queue of the tier (tier_queue.sh) is already running;
#   - refuses when src/ or include/ differ from ARITH_REV (bc95e0c), the arithmetic every archived run
#     was made with: a change in the order of a sum moves a SoftMoE run by up to a seed's spread
#     (BENCHMARKS.md, "The runs are deterministic"), so one figure's runs keep one code's arithmetic
#     (the machine's CPU and OpenBLAS kernels move the bits too; each archived run records them in
#     its `host` file from 2026-12-02, and "Same binary, other kind of CPU" measures it);
#   - checks each part with `bench tokenize --dry-run` (a misspelt variant stops here, not in a queue);
#   - restores the archived runs into BENCH_DIR/tokenize-full (runs_archive.sh restore: only those not
#     finished there), so a new machine continues where the last one stopped, and prints this
#     machine's host line beside the archive's runs counted by host (runs_archive.sh hosts);
#   - copies the binary to BENCH_DIR/specmoe-<commit> (rebuilding build/ must not change a queue's
#     binary halfway).
# --print checks the parts and prints them (a line each) and the two queue commands, and starts nothing.
#
# The parts put the runs that decide a claim first. A figure's variants that no claim names (Fig. 7's
# PerPatch, Fig. 11's resets of the 2 most dormant experts, Fig. 5's unscaled and PerFeat tokenised
# baselines) complete the figures afterwards: about a third of what is left, so the remaining claims
# are decided that much sooner; each is provisional until its figure is complete.
set -u
here=$(dirname "$(readlink -f "$0")")
root=$(readlink -f "$here/../..")
print=0
[ "${1:-}" = "--print" ] && { print=1; shift; }
bench=$(readlink -m "${1:-/work/bench-runs}")
out=$bench/tokenize-full
bin=$(readlink -m "${SPECMOE:-$root/build/specmoe}")
arith=${ARITH_REV:-bc95e0c}
G=breakout,asterix,freeway,seaquest,space_invaders
parts=(
    "7;$G;3;softmoe-1,softmoe-1-perfeat,softmoe-1-shuffled,softmoe-1-x4,softmoe-1-x4-perfeat,softmoe-1-x4-shuffled"
    "10;$G;3"
    "11;$G;3;softmoe-4,softmoe-4-reset,softmoe-4-sp"
    "5;$G;3;baseline-x4,tok-sum-x4,tok-mean-x4"
    "7;$G;3" "11;$G;3" "5;$G;3"
    "1,sharp,15,12,8,19;$G;3"
)
die() { echo "tier_start.sh: $*" >&2; exit 2; }
[ -x "$bin" ] || die "$bin is not built (make -j2)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lines=()
for p in "${parts[@]}"; do
    IFS=';' read -r figs games seeds variants <<< "$p"
    lines+=("tier-start part=$((${#lines[@]} + 1)) figures=$figs games=$games seeds=$seeds variants=${variants:-all}")
    sel=()
    [ -n "$variants" ] && sel=(--variants "$variants")
    "$bin" bench tokenize --tier full --dry-run --figures "$figs" --games "$games" --seeds "$seeds" "${sel[@]}" \
        --out "$tmp/plan" > "$tmp/plan.txt" 2>&1 || die "part \"$p\" is not a plan: $(tail -n 1 "$tmp/plan.txt")"
done
sha=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
qbin=$bench/specmoe-$sha
cmds=()
for c in 0 1; do
    cmds+=("RUNS_ARCHIVE=$root/docs/results/tokenize-full-runs $here/tier_queue.sh $qbin $out $c$(printf ' "%s"' "${parts[@]}")")
done
if [ $print = 1 ]; then
    printf '%s\n' "${lines[@]}" "${cmds[@]}"
    exit 0
fi
pgrep -f "tier_queue.sh " > /dev/null && die "a queue of the tier is already running (pgrep -af tier_queue.sh)"
git -C "$root" diff --quiet "$arith" HEAD -- src include 2>/dev/null ||
    die "src/ or include/ differ from $arith, the arithmetic of the archived runs (git diff --stat $arith HEAD -- src include); set ARITH_REV only for a new tier"
git -C "$root" diff --quiet -- src include || die "src/ or include/ have uncommitted changes"
mkdir -p "$bench"
"$here/runs_archive.sh" restore "$out" || die "restoring the archive into $out failed"
SPECMOE=$bin "$here/runs_archive.sh" hosts || die "cannot count the archive's runs by host"
[ -e "$qbin" ] || cp "$bin" "$qbin" || die "cannot copy $bin to $qbin"
for c in 0 1; do
    # exec: no shell stays behind as the queue's parent holding this script's standard output (a
    # caller reading it through a pipe would wait for the queues to end, hours)
    (cd "$bench" && RUNS_ARCHIVE=$root/docs/results/tokenize-full-runs exec nohup setsid "$here/tier_queue.sh" "$qbin" "$out" "$c" \
        "${parts[@]}" > /dev/null 2>&1 &)
    sleep 5
done
echo "tier_start.sh: two queues on $out (logs $out/queue-0.log, queue-1.log); progress: grep -h status=ok $out/queue-*.log | tail"
echo "tier_start.sh: the queues save finished runs into docs/results/tokenize-full-runs every ${SAVE_EVERY:-300} s; before the session stops: $here/runs_archive.sh save $out, and commit it"
