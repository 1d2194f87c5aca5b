#!/bin/bash
# Keeps the finished runs of `bench tokenize` in the repository, so that the full tier (about 125
# CPU hours, many sessions) accumulates even when the machine that ran a part is gone.
#
#   tools/softmoe_rl/runs_archive.sh save OUT [ARCHIVE]      finished runs under OUT -> ARCHIVE
#   tools/softmoe_rl/runs_archive.sh restore OUT [ARCHIVE]   ARCHIVE -> OUT (runs not finished there)
#   tools/softmoe_rl/runs_archive.sh hosts [ARCHIVE]         this machine's host line, and the archived
#                                                            runs counted by the host that made them
#
# OUT is the bench's --out; ARCHIVE defaults to docs/results/tokenize-full-runs (of this checkout).
# A run is OUT/<agent>-<encoder>/<variant>/<game>-s<seed> with a `done` file. Kept per run:
#   settings.json, command, train.log, done  as the run wrote them;
#   host           the machine it ran on, written by the save (a run is saved from the machine that
#                  ran it: its checkpoints never leave it): `cpu="MODEL" family=F model=M isa=ISA
#                  openblas-core=CORE`, ISA the widest of avx512f/avx2/baseline the CPU has and CORE
#                  the kernels OpenBLAS picks there (OPENBLAS_VERBOSE=2 of build/specmoe, or of
#                  $SPECMOE). Both set the order of a run's sums, so one command and seed gives other
#                  bits on another kind of CPU (BENCHMARKS.md, "The runs are deterministic");
#   metrics.jsonl  the learning curve, one record per 50,000 frames: {"global_step": END,
#                  "curve_return": MEAN, "curve_episodes": N} over the episodes ending in that bin
#                  (`specmoe plot DIR... --y curve_return` draws it); then the episodes
#                  `specmoe report` scores, those ending in the last 10% of the run's frames
#                  (global_step >= 0.9 x the last episode's; the same rule as cli/cmd_report.c), so a
#                  restored run scores exactly as the original. The full metrics.jsonl (every
#                  episode, losses, dormant fractions: 1-20 MB a run) stays on the machine that ran it.
# A restored run has `done`, so the bench skips it and its reports (and --reference-runs) include it.
# A save holds a lock on ARCHIVE (flock on the directory), so the two queues' periodic saves
# (tier_queue.sh) never write one run at once, and writes each run into a scratch directory beside
# it (RUN.saving, which restore ignores) that it then renames: a save stopped halfway leaves no run in
# the archive without its curve.
set -eu
usage() { echo "usage: $0 save|restore OUT [ARCHIVE] | hosts [ARCHIVE]" >&2; exit 2; }
here=$(dirname "$(readlink -f "$0")")
default_archive=$here/../../docs/results/tokenize-full-runs
[ $# -ge 1 ] || usage
mode=$1
if [ "$mode" = hosts ]; then
    archive=$(readlink -m "${2:-$default_archive}")
else
    [ $# -ge 2 ] || usage
    out=$2 archive=$(readlink -m "${3:-$default_archive}")
fi

# this machine's host line (the `host` file above): the first processor's fields, ISA the widest of
# avx512f, avx2 its flags name, and the kernels OpenBLAS picks here
host_line() {
    local probe=${SPECMOE:-$here/../../build/specmoe} core
    core=$(OPENBLAS_VERBOSE=2 "$probe" --help 2>&1 | sed -n 's/^Core: *//p' | head -n 1)
    awk -F': *' -v core="${core:-unknown}" '
        /^[a-z ]*[[:space:]]*:/ { k = $1; sub(/[[:space:]]+$/, "", k); if (!(k in v)) v[k] = $2 }
        END {
            isa = "baseline"; f = " " v["flags"] " "
            if (f ~ / avx2 /) isa = "avx2"; if (f ~ / avx512f /) isa = "avx512f"
            printf "cpu=\"%s\" family=%s model=%s isa=%s openblas-core=%s", v["model name"], v["cpu family"], v["model"], isa, core
        }' /proc/cpuinfo 2>/dev/null
}

# the archive's finished runs, as their `done` files (a save's scratch RUN.saving is not one)
archived_runs() { find "$archive" -mindepth 4 -maxdepth 4 -name done -not -path '*.saving/done' | sort; }

case $mode in
save)
    mkdir -p "$archive"
    exec 8< "$archive"
    flock 8
    n=0 host=
    while IFS= read -r d; do
        run=${d%/done}
        rel=${run#"$out"/}
        dest=$archive/$rel
        [ -f "$dest/done" ] && continue
        [ -n "$host" ] || host=$(host_line)
        part=$dest.saving
        rm -rf "$part"
        mkdir -p "$part"
        for f in settings.json command train.log done; do
            [ -f "$run/$f" ] && cp "$run/$f" "$part/$f"
        done
        echo "$host" > "$part/host"
        # the curve, then the episodes of the last 10% of frames, from one pass over the episode lines
        awk '
            /"episodic_return"/ {
                if (!match($0, /"global_step": *[-0-9.eE+]+/)) next
                s = substr($0, RSTART, RLENGTH); sub(/.*: */, "", s)
                if (!match($0, /"episodic_return": *[-0-9.eE+]+/)) next
                r = substr($0, RSTART, RLENGTH); sub(/.*: */, "", r)
                n++; step[n] = s + 0; line[n] = $0; ret[n] = r + 0
                if (s + 0 > xmax) xmax = s + 0
            }
            END {
                for (i = 1; i <= n; i++) {
                    b = int((step[i] - 1) / 50000); cnt[b]++; sum[b] += ret[i]; if (b > bmax) bmax = b
                }
                for (b = 0; b <= bmax; b++)
                    if (cnt[b]) printf "{\"global_step\": %d, \"curve_return\": %.9g, \"curve_episodes\": %d}\n", (b + 1) * 50000, sum[b] / cnt[b], cnt[b]
                for (i = 1; i <= n; i++)
                    if (step[i] >= 0.9 * xmax) print line[i]
            }' "$run/metrics.jsonl" > "$part/metrics.jsonl"
        rm -rf "$dest"
        mv "$part" "$dest"
        n=$((n + 1))
    done < <(find "$out" -mindepth 4 -maxdepth 4 -name done | sort)
    echo "runs_archive: $n new finished runs saved to $archive"
    ;;
restore)
    [ -d "$archive" ] || { echo "runs_archive: no archive at $archive" >&2; exit 1; }
    n=0
    while IFS= read -r d; do
        run=${d%/done}
        rel=${run#"$archive"/}
        dest=$out/$rel
        [ -f "$dest/done" ] && continue
        mkdir -p "$dest"
        rm -f "$dest/checkpoint.safetensors"
        cp "$run"/* "$dest/"
        n=$((n + 1))
    done < <(archived_runs)
    echo "runs_archive: $n finished runs restored into $out"
    ;;
hosts)
    # Which machine made which archived run: runs on kinds of CPU whose sums differ are other samples
    # of the same agent (BENCHMARKS.md, "Same binary, other kind of CPU"), so a session on a new
    # machine sees here whether it adds to the archive's bits or to another machine's
    [ -d "$archive" ] || { echo "runs_archive: no archive at $archive" >&2; exit 1; }
    me=$(host_line)
    echo "runs_archive: this machine: $me"
    archived_runs | while IFS= read -r d; do
        h=${d%/done}/host
        if [ -f "$h" ]; then head -n 1 "$h"; else echo "(no host file: saved before 2026-12-02)"; fi
    done | sort | uniq -c | sort -k1,1nr -k2 | while read -r n h; do
        [ "$h" = "$me" ] && h="$h (this machine)"
        printf 'runs_archive: %5d runs  %s\n' "$n" "$h"
    done
    ;;
*)
    usage
    ;;
esac
