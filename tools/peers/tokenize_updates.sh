#!/usr/bin/env bash
# Time and FLOP-count the update of every network of `specmoe bench tokenize` (issue 14: "frames/s of
# each agent variant and the fraction of the FLOP roofline of its update"). One line per variant:
# the DQN update (batch 32, two forwards and a backward, tools/peers/dqn_update.c) of that variant's
# network on MinAtar Breakout's 4 x 10 x 10 frames, CPU time per update, MFLOP per update
# (sm_model_update_macs) and the fraction of the one-core FMA peak per CPU second. The arch strings
# are those `specmoe bench tokenize --dry-run` prints (the Figs. 1, 5, 7, 8, 12, 15 variants).
# Usage: tools/peers/tokenize_updates.sh [SECONDS per variant, default 2]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-2}
make -s build/libspecmoe.a
# a library built with MPI (the Makefile's default when mpicc is there) needs MPI's link flags too
mpi=$(command -v mpicc >/dev/null 2>&1 && mpicc --showme:link || true)
cc -O3 -march=x86-64-v2 -mtune=native -fopenmp -Iinclude -I. tools/peers/dqn_update.c experiments/engine/peak.c \
   build/libspecmoe.a -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -llapacke -lcjson -lmujoco -lz -lm $mpi \
   -o build/dqn_update
while read -r name args; do
    line=$(build/dqn_update --seconds "$secs" $args | tail -1)
    get() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    printf 'tokenize-update variant=%s mflop=%s cpu_us_per_update=%s cpu_gflops=%s cpu_roofline_fraction=%s\n' \
        "$name" "$(get mflop)" "$(get cpu_us_per_update)" "$(get cpu_gflops)" "$(get cpu_roofline_fraction)"
done <<'LIST'
baseline --arch conv:16:3:1:0,dense:128
baseline-x4 --arch conv:16:3:1:0,dense:512
softmoe-4 --arch conv:16:3:1:0,tokens,moe:128,flatten --router soft --experts 4
softmoe-1 --arch conv:16:3:1:0,tokens,moe:128,flatten --router soft --experts 1
softmoe-1-x4 --arch conv:16:3:1:0,tokens,moe:512,flatten --router soft --experts 1
softmoe-1-perfeat --arch conv:16:3:1:0,perfeat,moe:128,flatten --router soft --experts 1
softmoe-1-perpatch --arch conv:16:3:1:0,avgpool:2:2,tokens,moe:128,flatten --router soft --experts 1
softmoe-1-shuffled --arch conv:16:3:1:0,shuffle:7,tokens,moe:128,flatten --router soft --experts 1
softmoe-1-slot1 --arch conv:16:3:1:0,tokens,moe:128,flatten --router soft --experts 1 --slots 1
softmoe-4-slots10 --arch conv:16:3:1:0,tokens,moe:128,flatten --router soft --experts 4 --slots 2
expert-choice-4 --arch conv:16:3:1:0,tokens,moe:128,flatten --router expert-choice --experts 4
token-choice-4 --arch conv:16:3:1:0,tokens,moe:128,flatten --router topk --experts 4 --topk 1
tok-sum --arch conv:16:3:1:0,tokens,toksum,dense:128
tok-mean --arch conv:16:3:1:0,tokens,tokmean,dense:128
gap --arch conv:16:3:1:0,gap,dense:128
LIST
