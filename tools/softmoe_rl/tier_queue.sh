#!/bin/bash
# Runs parts of `bench tokenize --tier full` one after another on one core: the way the full tier is
# spread over sessions of a 2-core machine (two queues, one per core). The queues may share parts:
# a run one of them is training is held (DIR/lock, cli_run_lock) and the other skips it as busy.
# Stop a queue with its training (kill the process group, or `pkill -f "BINARY "`): a training left
# running after its bench is killed still holds its run and finishes it, but no one writes its
# `done`, so the next bench resumes it from its last checkpoint (time lost, nothing corrupted).
#
#   tools/softmoe_rl/tier_queue.sh BINARY OUT CORE "FIGURES;GAMES;SEEDS[;VARIANTS]" ...
#
# BINARY  a copy of build/specmoe that stays put while the queue runs (rebuilding build/ would change
#         the runs' binary halfway); OUT the bench's --out; CORE the core to pin to (taskset).
# Each part is one `bench tokenize --tier full --jobs 1 --figures FIGURES --games GAMES --seeds SEEDS`
# (SEEDS is a count: seeds 1..SEEDS), with --variants VARIANTS when given. Finished runs are skipped and interrupted ones resume from their
# checkpoint (the bench's own rule), so a queue can be stopped and started again with the same parts.
# The log is OUT/queue-CORE.log. When RUNS_ARCHIVE names the archive, the finished runs are saved
# into it (tools/softmoe_rl/runs_archive.sh save) every SAVE_EVERY seconds (default 300) while a part
# runs, and once more after it: a part is up to 120 runs (many sessions), and a run saved into the
# checkout as it finishes outlives a session that stops before its closing save and commit.
set -u
[ $# -ge 4 ] || { echo "usage: $0 BINARY OUT CORE \"FIGURES;GAMES;SEEDS[;VARIANTS]\" ..." >&2; exit 2; }
bin=$(readlink -f "$1") out=$2 core=$3
shift 3
mkdir -p "$out"
log=$out/queue-$core.log
here=$(dirname "$(readlink -f "$0")")
# the finished runs into the archive (the queue's binary tells the host's OpenBLAS kernels)
save() { SPECMOE=$bin "$here/runs_archive.sh" save "$out" "$RUNS_ARCHIVE" 2>&1; }
for part in "$@"; do
    IFS=';' read -r figs games seeds variants <<< "$part"
    sel=()
    [ -n "$variants" ] && sel=(--variants "$variants")
    echo "$(date -u +%FT%TZ) start figures=$figs games=$games seeds=$seeds variants=${variants:-all}" >> "$log"
    taskset -c "$core" "$bin" bench tokenize --tier full --jobs 1 --figures "$figs" --games "$games" \
        --seeds "$seeds" "${sel[@]}" --out "$out" >> "$log" 2>&1 &
    bench=$!
    saver=
    if [ -n "${RUNS_ARCHIVE:-}" ]; then
        (while sleep "${SAVE_EVERY:-300}"; do save | grep -v '^runs_archive: 0 new' >> "$log"; done) &
        saver=$!
    fi
    wait "$bench"
    rc=$?
    [ -n "$saver" ] && kill "$saver" 2>/dev/null
    echo "$(date -u +%FT%TZ) end figures=$figs games=$games seeds=$seeds rc=$rc" >> "$log"
    [ -n "${RUNS_ARCHIVE:-}" ] && save >> "$log"
done
