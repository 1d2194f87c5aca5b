#!/usr/bin/env bash
# CLI checks: help texts, usage errors (exit 2), runtime errors (exit 1, "specmoe: ..." message),
# a short real training run with its artefacts, eval/info on its checkpoint, and safetensors
# interoperability with PyTorch when Debian's python3-torch is installed.
# Usage: tests/cli_tests.sh path/to/specmoe. Last line: "cli: N passed, M failed".
set -u
bin=${1:?usage: cli_tests.sh path/to/specmoe}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/specmoe-cli-XXXXXX)
# a run without --out writes to a new directory under ./runs: keep those in the scratch directory
cd "$tmp" || exit 1
pass=0; fail=0
ok()   { pass=$((pass + 1)); echo "ok   $1"; }
bad()  { fail=$((fail + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && echo "     $2"; }
# expect CODE NAME PATTERN -- command...: exit status CODE and output (stdout+stderr) matching PATTERN
expect() {
    local code=$1 name=$2 pat=$3; shift 4
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -ne "$code" ]; then bad "$name" "exit $rc, wanted $code: $(echo "$out" | tail -n 3)"; return; fi
    if [ -n "$pat" ] && ! echo "$out" | grep -qE -- "$pat"; then bad "$name" "output lacks /$pat/: $(echo "$out" | tail -n 3)"; return; fi
    ok "$name"
}
# expect_table NAME HEADING "WORDS" -- command...: `command --help` exits 0 and its stdout lists, under
# "HEADING:", one row for each of WORDS (in sort order) and nothing else; `command WORD --help` exits 0
expect_table() {
    local name=$1 heading=$2 want=$3; shift 4
    local out rc rows r
    out=$("$@" --help 2>/dev/null); rc=$?
    rows=$(echo "$out" | sed -n "/^$heading:\$/,/^\$/p" | sed -nE 's/^  ([a-z][a-z0-9-]*) .*/\1/p')
    if [ $rc -ne 0 ]; then bad "$name" "exit $rc, wanted 0"; return; fi
    if [ "$(echo "$rows" | LC_ALL=C sort | tr '\n' ' ')" != "$want " ]; then bad "$name" "rows: $(echo $rows); wanted: $want"; return; fi
    for r in $rows; do "$@" "$r" --help >/dev/null 2>&1 || { bad "$name" "$* $r --help fails"; return; }; done
    ok "$name"
}

expect 0 "top-level help"            "train"                 -- "$bin" --help
expect 2 "no command is a usage error" "usage"               -- "$bin"
expect 2 "unknown command"           "unknown command"       -- "$bin" frobnicate
# the command table (cli/main.c): the help has exactly one row per command, each row is a command
# with a working --help, and the unknown-command message names them all
expect_table "top-level help lists every command once" commands "analyze bench bingham-z eval info plot report rl ssmoe train" -- "$bin"
expect 2 "unknown command names every command" "unknown command 'frobnicate' .*train.*bingham-z" -- "$bin" frobnicate
ver=$(sed -nE 's/^#define CLI_VERSION "(.*)"/\1/p' "$root/cli/common.h")
expect 0 "--version prints the version of cli/common.h" "^specmoe ${ver:-missing}\$" -- "$bin" --version
expect 0 "train --help lists flags with defaults" "--lr NUM .*\[1e-3\]" -- "$bin" train --help
for f in data classes per-class batch threads arch experts topk temperature noisy renorm capacity shared epochs optim lr schedule warmup clip seed out resume; do
    "$bin" train --help | grep -q -- "--$f " || bad "train --help lists --$f"
done
expect 0 "eval --help"               "--split"               -- "$bin" eval --help
# --router's help names every router the library knows (its "unknown router" error lists them)
known=$("$bin" train --router nope 2>&1 | sed -nE 's/.*unknown router .nope. \(known: (.*)\).*/\1/p' | tr -d ',')
for c in train eval; do
    line=$("$bin" $c --help 2>/dev/null | grep -E -- '^  --router ')
    missing=
    for r in ${known:-unknown-list} prototype ev; do echo "$line" | grep -qw -- "$r" || missing="$missing $r"; done
    [ -z "$missing" ] && ok "$c --help lists every router under --router, prototype and ev too" \
        || bad "$c --help lists every router under --router, prototype and ev too" "missing:$missing in: $line"
done
expect 0 "info --help"               "CHECKPOINT"            -- "$bin" info --help
expect 0 "bench layer --help"        "--shapes"              -- "$bin" bench layer --help
# the benchmark table (cli/cmd_bench.c), like the command table
expect_table "bench --help lists every benchmark once" benchmarks "alpha dist env gemm layer oneshot routing sphere ssmoe ssmoe-build tokenize" -- "$bin" bench
expect 2 "bench: unknown benchmark names every benchmark" "unknown benchmark 'nope' .*layer.*ssmoe-build" -- "$bin" bench nope
expect 2 "bench without a benchmark is a usage error" "usage: specmoe bench BENCHMARK" -- "$bin" bench
# reinforcement learning (cli/cmd_rl.c): the subcommand table, environments, the random-policy reference
expect_table "rl --help lists every subcommand once" subcommands "envs eval render train" -- "$bin" rl
expect 2 "rl: unknown subcommand names every subcommand" "unknown subcommand 'nope' .*envs.*eval" -- "$bin" rl nope
expect 0 "rl envs lists cartpole with its spaces and time limit" "^classic/cartpole +4 +discrete 2 +500 " -- "$bin" rl envs
expect 0 "rl envs lists pendulum's box action with its bounds" "^classic/pendulum +3 +box 1 in \[-2, 2\] +200 " -- "$bin" rl envs
# a uniform random policy keeps CartPole up for about 22 steps (gymnasium's random baseline)
out=$("$bin" rl eval --env classic/cartpole --policy random --episodes 500 --seed 3 2>&1); rc=$?
mean=$(echo "$out" | sed -nE 's/.* episodic_return_mean=([0-9.]+) .*/\1/p')
if [ $rc -eq 0 ] && awk -v m="${mean:-0}" 'BEGIN { exit !(m > 19 && m < 26) }'; then
    ok "rl eval --policy random on cartpole: mean return $mean (about 22)"
else
    bad "rl eval --policy random on cartpole: mean return about 22" "exit $rc: $out"
fi
out2=$("$bin" rl eval --env classic/cartpole --policy random --episodes 500 --seed 3 --threads 2 2>&1)
[ "$out" = "$out2" ] && ok "rl eval: the result does not depend on --threads" || bad "rl eval: the result does not depend on --threads" "$out / $out2"
expect 0 "rl eval --policy random on pendulum (box actions)" "episodic_return_mean=-[0-9]+.* episodic_length_mean=200.00" -- \
    "$bin" rl eval --env classic/pendulum --policy random --episodes 4
expect 2 "rl eval: an unknown environment is refused, naming the valid ones" \
    "unknown environment 'classic/nope' .*classic/cartpole.*classic/pendulum" -- "$bin" rl eval --env classic/nope --policy random
expect 2 "rl eval: --episodes 0 refused" "--episodes must be in \[1, 1e9\] and --threads >= 1" -- "$bin" rl eval --env classic/cartpole --policy random --episodes 0
expect 2 "rl eval: a bad number refused" "--episodes: 'ten' is not a valid integer" -- "$bin" rl eval --env classic/cartpole --policy random --episodes ten
expect 2 "rl eval: a bad seed refused" "--seed: '-1' is not" -- "$bin" rl eval --env classic/cartpole --policy random --seed -1
expect 2 "rl eval: an unknown policy refused" "unknown policy 'greedy' \(one of: random\)" -- "$bin" rl eval --env classic/cartpole --policy greedy
expect 1 "rl eval CKPT: a missing checkpoint is named" "run.safetensors: cannot open" -- "$bin" rl eval run.safetensors --env classic/cartpole
# rl train (cli/cmd_rl_train.c): agents, their option flags, refusals before any work, the run directory
expect 0 "rl train --help lists every agent and its options" "^  rainbow - Rainbow-lite" -- "$bin" rl train --help
expect 2 "rl train: an unknown agent is named with the valid ones" "unknown agent 'nope' \(one of: dqn, rainbow, der" -- "$bin" rl train --env classic/cartpole --agent nope
expect 2 "rl train: dqn refuses box actions with the reason" "cannot run on classic/pendulum: .*discrete actions" -- "$bin" rl train --env classic/pendulum --agent dqn
expect 2 "rl train: a batch larger than the buffer is refused" "batch_size 512 is larger than the replay buffer_size 100" -- "$bin" rl train --env classic/cartpole --batch-size 512 --buffer-size 100
expect 2 "rl train: n-step 0 is refused" "n_step must be >= 1" -- "$bin" rl train --env classic/cartpole --n-step 0
expect 2 "rl train: an unknown preset names the valid ones" "no preset 'x' \(presets: minatar, cleanrl, dopamine\)" -- "$bin" rl train --env classic/cartpole --preset x
expect 2 "rl train: a bad option value is refused" "--lr: invalid value 'fast'" -- "$bin" rl train --env classic/cartpole --lr fast
rl_out="$tmp/rl_dqn"
expect 0 "rl train: a short DQN run on cartpole writes its run directory" "^rl-train env=classic/cartpole agent=dqn frames=3000 " -- \
    "$bin" rl train --env classic/cartpole --agent dqn --frames 3000 --learning-starts 500 --out "$rl_out"
expect 0 "rl train: settings.json holds every option" '"agent_settings":' -- cat "$rl_out/settings.json"
expect 0 "rl train: metrics.jsonl speaks CleanRL (episodic_return, losses/td_loss)" '"episodic_return".*|"losses/td_loss"' -- cat "$rl_out/metrics.jsonl"
expect 0 "rl eval CKPT: the trained policy is evaluated" "^rl-eval env=classic/cartpole policy=.*agent=dqn episodes=5 " -- \
    "$bin" rl eval "$rl_out/checkpoint.safetensors" --episodes 5
expect 2 "rl eval CKPT: a checkpoint and --policy random together are refused" "not both" -- \
    "$bin" rl eval "$rl_out/checkpoint.safetensors" --policy random
expect 0 "rl render: an episode of the trained policy as an animated GIF" "^rl-render env=classic/cartpole frames=[0-9]+ " -- \
    "$bin" rl render "$rl_out/checkpoint.safetensors" --out "$tmp/episode.gif" --max-steps 50 --size 64
expect 0 "rl render: the file is a GIF89a" "GIF89a" -- head -c 6 "$tmp/episode.gif"
expect 2 "rl render: a checkpoint is required" "give the checkpoint" -- "$bin" rl render
# a run split by --stop-after and continued with --resume alone (settings from the checkpoint) ends in
# the same checkpoint bytes as the run straight through
expect 0 "rl train --stop-after checkpoints and says how to continue" "continue with:.*|--resume $tmp/rl_split/checkpoint.safetensors" -- \
    "$bin" rl train --env classic/cartpole --agent rainbow --frames 3000 --learning-starts 500 --stop-after 1300 --out "$tmp/rl_split"
expect 0 "rl train --resume takes the run's settings from the checkpoint" "^rl-train env=classic/cartpole agent=rainbow frames=3000 " -- \
    "$bin" rl train --resume "$tmp/rl_split/checkpoint.safetensors"
expect 0 "rl train: the same run straight through" "^rl-train env=classic/cartpole agent=rainbow frames=3000 " -- \
    "$bin" rl train --env classic/cartpole --agent rainbow --frames 3000 --learning-starts 500 --out "$tmp/rl_straight"
expect 0 "rl train: split and resumed equals straight through, byte for byte" "" -- \
    cmp "$tmp/rl_split/checkpoint.safetensors" "$tmp/rl_straight/checkpoint.safetensors"
expect 2 "rl train --resume refuses a conflicting setting by name" "--lr 0.1 conflicts with the checkpoint's 6.25e-05" -- \
    "$bin" rl train --resume "$tmp/rl_split/checkpoint.safetensors" --lr 0.1
# the network of an agent may tokenise its encoder and route the tokens ("Don't Flatten, Tokenize!")
expect 0 "rl train: a tokenised SoftMoE network (--arch ...,tokens,moe:H,flatten --router soft)" \
    "^rl-train env=minatar/breakout agent=dqn frames=600 " -- "$bin" rl train --env minatar/breakout --agent dqn \
    --arch conv:4:3:1:0,tokens,moe:8,flatten,dense:16 --router soft --experts 2 --frames 600 --learning-starts 200 \
    --log-every 200 --out "$tmp/rl_soft"
expect 0 "rl train: the router is in the run's settings" '"router":[[:space:]]*"soft"' -- cat "$tmp/rl_soft/settings.json"
expect 0 "rl train: dormant neurons per layer and per expert are logged" '"dormant/layers.0": [0-9.e-]+, "dormant/layers.2.expert0"' -- \
    cat "$tmp/rl_soft/metrics.jsonl"
expect 0 "rl eval --routing: a soft layer's combine and dispatch entropies, normalised to (0, 1]" \
    "rl-eval-routing moe=0 soft=1 combine_entropy=(0\.[0-9]*[1-9][0-9]*|1\.0000) dispatch_entropy=(0\.[0-9]*[1-9][0-9]*|1\.0000) tokens=[1-9]" -- \
    "$bin" rl eval "$tmp/rl_soft/checkpoint.safetensors" --episodes 2 --routing 1
expect 2 "rl eval --routing refuses a network without an MoE layer" "--routing: the policy's network has no MoE layer" -- \
    "$bin" rl eval "$tmp/rl_straight/checkpoint.safetensors" --episodes 1 --routing 1
expect 2 "rl eval --routing refuses pruned experts (the entropies are over every slot)" "--routing: not with --prune-experts" -- \
    "$bin" rl eval "$tmp/rl_soft/checkpoint.safetensors" --episodes 1 --routing 1 --prune-experts 1
expect 2 "rl eval --routing refuses the random policy" "--routing reads a checkpoint's MoE layers" -- \
    "$bin" rl eval --env classic/cartpole --policy random --routing 1
expect 2 "rl train: a flag of another router is refused, naming it" "--kr is an option of the grassmann router, not of topk" -- \
    "$bin" rl train --env classic/cartpole --agent dqn --kr 4 --frames 10
expect 2 "rl train --resume refuses another router" "--router topk conflicts with the checkpoint's soft" -- \
    "$bin" rl train --resume "$tmp/rl_soft/checkpoint.safetensors" --router topk
# SPHERE on a PPO actor (App. A.3): bad values refused before any work, a short run logs the penalty
expect 2 "rl train: --sphere-rho < 0 is refused" "sphere_rho must be >= 0 \(got -1\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --sphere-rho -1 --frames 256
expect 2 "rl train: an unknown --sphere-mode names the two" "sphere_mode must be grad, loss or fixed \(got 'foo'\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --sphere-mode foo --frames 256
expect 2 "rl train: --sphere-rho on an actor with no MoE layer is refused" "needs an MoE actor" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --sphere-rho 0.01 --frames 256
expect 0 "rl train: SPHERE (loss mode, per-expert ablation) on an MoE actor" "^rl-train env=mujoco/reach-0 agent=ppo frames=256 " -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --arch dense:16,moe:16 --experts 4 --topk 2 --num-envs 2 --num-steps 64 \
    --num-minibatches 2 --update-epochs 1 --frames 256 --sphere-rho 0.05 --sphere-mode loss --sphere-per-expert 1 --out "$tmp/rl_sphere"
expect 0 "rl train: SPHERE's penalty and coefficient are in metrics.jsonl" '"sphere/penalty": [0-9.e+-]+, "sphere/coef": [0-9.e+-]+' -- \
    cat "$tmp/rl_sphere/metrics.jsonl"
# the gradient-Gram ablation (Table 1, Eq. 20): a bad value names both, a tiny run on the moe actor, the placement it refuses
expect 0 "rl train --help lists --sphere-gram" "--sphere-gram +SPHERE ablation: feature \(Eq. 19\) or gradient" -- "$bin" rl train --help
expect 2 "rl train: an unknown --sphere-gram names the two" "sphere_gram must be feature or gradient \(got 'grad'\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --sphere-gram grad --frames 256
expect 0 "rl train: SPHERE on the gradient Gram of a moe actor logs its penalty" '"sphere/penalty": [0-9.e+-]+, "sphere/coef": [0-9.e+-]+' -- \
    sh -c "'$bin' rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:16,dense:16 --experts 4 --topk 2 --num-envs 2 \
    --num-steps 64 --num-minibatches 2 --update-epochs 1 --frames 256 --sphere-rho 0.001 --sphere-gram gradient --out '$tmp/rl_ggram' >/dev/null &&
    grep -q '\"sphere_gram\":\s*\"gradient\"' '$tmp/rl_ggram/settings.json' && cat '$tmp/rl_ggram/metrics.jsonl'"
expect 2 "rl train: the gradient Gram of an MoE layer with a head after it is refused" "the gradient Gram needs the MoE layer to be the network's output" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --arch dense:16,moe:16 --experts 4 --topk 2 --num-envs 2 --num-steps 64 \
    --num-minibatches 2 --update-epochs 1 --frames 256 --sphere-rho 0.001 --sphere-gram gradient --out "$tmp/rl_ggram2"
expect 2 "rl train: --diag-states above the minibatch is refused" "diag_states must be in \[1, the minibatch 64\] \(got 65\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --num-envs 2 --num-steps 64 --num-minibatches 2 --diag-states 65 --frames 256
expect 2 "rl train: --diag-every < 0 is refused" "diag_every must be >= 0" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --diag-every -1 --frames 256
expect 0 "rl train --diag-every: diagnostics on a held-out batch" "^rl-train env=mujoco/reach-0 agent=ppo frames=256 " -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:8,dense:8 --experts 3 --topk 2 --num-envs 2 \
    --num-steps 64 --num-minibatches 2 --update-epochs 1 --frames 256 --diag-every 1 --diag-states 16 --out "$tmp/rl_diag"
expect 0 "rl train --diag-every: eNTK and feature ranks, dormant ratio, norms in metrics.jsonl" \
    '"diag/entk_srank": [0-9.e+-]+, "diag/dormant": [0-9.e+-]+, "diag/grad_norm": [0-9.e+-]+, "diag/feature_srank": [0-9.e+-]+' -- \
    cat "$tmp/rl_diag/metrics.jsonl"
expect 0 "rl train --diag-every: App. J.11's specialisation metrics in metrics.jsonl" \
    '"diag/overlap": [0-9.e+-]+, "diag/orthogonality": [0-9.e+-]+, "diag/silhouette": ([0-9.e+-]+|null|NaN|nan), "diag/knn_jaccard": [0-9.e+-]+, "diag/max_vio": [0-9.e+-]+, "diag/active_ratio": [0-9.e+-]+, "diag/routing_entropy": [0-9.e+-]+' -- \
    cat "$tmp/rl_diag/metrics.jsonl"
[ "$(grep -cE '^-?[0-9.e+-]+ -?[0-9.e+-]+ [0-7]$' "$tmp/rl_diag/fig6.dat" 2>/dev/null)" = 16 ] \
    && ok "rl train --diag-every with an MoE actor writes fig6.dat (SPHERE Fig. 6), one line per held-out state" \
    || bad "rl train --diag-every with an MoE actor writes fig6.dat (SPHERE Fig. 6), one line per held-out state"
if command -v gnuplot >/dev/null 2>&1; then
    expect 0 "plot one diagnostic against another prints their Pearson correlation (SPHERE Fig. 7)" \
        "^plot: .*rl_diag: Pearson r\(diag/feature_srank, diag/entk_srank\) = [-0-9.]+ over 2 records" -- \
        "$bin" plot "$tmp/rl_diag" --x diag/feature_srank --y diag/entk_srank --out "$tmp/fig7.png"
fi
expect 0 "rl train --diag-slq runs" "^rl-train env=mujoco/reach-0 agent=ppo frames=128 " -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:8,dense:8 --experts 3 --topk 2 --num-envs 2 \
    --num-steps 64 --num-minibatches 2 --update-epochs 1 --frames 128 --diag-every 1 --diag-states 16 --diag-slq 20 \
    --out "$tmp/rl_slq"
expect 0 "rl train --diag-slq: the eNTK rank by SLQ beside the exact one, with its relative error" \
    '"diag/entk_srank_slq": [0-9.e+-]+, "diag/entk_slq_se": [0-9.e+-]+, "diag/entk_slq_rel_error": [0-9.e+-]+' -- \
    cat "$tmp/rl_slq/metrics.jsonl"
expect 2 "rl train: --diag-slq < 0 is refused" "diag_slq must be >= 0" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --diag-slq -1 --frames 256
# the plasticity baselines of SPHERE's comparison (PW, ReDo, CBP, SN, C-CHAIN): bad values refused before any work,
# short runs on the dense and the MoE actor log their quantities
expect 2 "rl train: --pw-coef < 0 is refused" "pw_coef must be a number >= 0 \(got -1\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --pw 1 --pw-coef -1 --frames 256
expect 2 "rl train: --redo-every 0 is refused" "redo_every must be >= 1 gradient step \(got 0\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --redo 1 --redo-every 0 --frames 256
expect 2 "rl train: --redo-tau < 0 is refused" "redo_tau must be >= 0 \(got -0.5\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --redo 1 --redo-tau -0.5 --frames 256
expect 2 "rl train: --cbp-rate above 1 is refused" "cbp_rate must be in \[0, 1\] \(got 2\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --cbp 1 --cbp-rate 2 --frames 256
expect 2 "rl train: --cbp-decay 1 is refused" "cbp_decay must be in \[0, 1\) \(got 1\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --cbp 1 --cbp-decay 1 --frames 256
expect 2 "rl train: --sn takes 0 or 1" "--sn: invalid value 'maybe'" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --sn maybe --frames 256
expect 2 "rl train: --cchain-ratio < 0 is refused" "cchain_ratio must be a number >= 0 \(got -1\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --cchain 1 --cchain-ratio -1 --frames 256
expect 2 "rl train: --cbp-maturity < 0 is refused" "cbp_maturity must be >= 0 \(got -3\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --cbp 1 --cbp-maturity -3 --frames 256
for actor in mlp moe; do
    expect 0 "rl train: PW, ReDo, CBP, SN and C-CHAIN on the $actor actor" "^rl-train env=mujoco/reach-0 agent=ppo frames=256 " -- \
        "$bin" rl train --env mujoco/reach-0 --agent ppo --actor $actor --arch dense:8,dense:8 --experts 3 --topk 2 \
        --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 2 --frames 256 --pw 1 --redo 1 --redo-every 2 \
        --cbp 1 --cbp-maturity 1 --cbp-rate 0.2 --cchain 1 --sn 1 --out "$tmp/rl_base_$actor"
    expect 0 "rl train: pw/, redo/, cbp/, sn/, cchain/ quantities of the $actor actor in metrics.jsonl" \
        '"pw/penalty": [0-9.e+-]+, "redo/reset_count": [0-9]+, "cbp/replaced": [1-9][0-9]*, "sn/sigma_max": [0-9.e+-]+, "cchain/churn": [0-9.e+-]+' -- \
        cat "$tmp/rl_base_$actor/metrics.jsonl"
done
# SR (spectral regularisation): bad values and SN beside it refused with the reason; a short run on each actor
# logs its penalty and sigma_max and records its settings
expect 0 "rl train --help lists --specreg and --specreg-k" "--specreg-k +SR: the exponent k \(default 2\)" -- "$bin" rl train --help
expect 2 "rl train: --specreg < 0 is refused" "specreg must be a number >= 0, the lambda of spectral regularisation \(got -1\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --specreg -1 --frames 256
expect 2 "rl train: --specreg-k below 1 is refused" "specreg_k must be a number >= 1, the exponent of sigma_max \(got 0.5\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --specreg 0.01 --specreg-k 0.5 --frames 256
expect 2 "rl train: --specreg with --sn is refused with the reason" "specreg with sn: spectral normalisation divides" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --specreg 0.01 --sn 1 --frames 256
for actor in mlp moe; do
    expect 0 "rl train: --specreg 0.01 on the $actor actor" "^rl-train env=mujoco/reach-0 agent=ppo frames=256 " -- \
        "$bin" rl train --env mujoco/reach-0 --agent ppo --actor $actor --arch dense:8,dense:8 --experts 3 --topk 2 \
        --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 2 --frames 256 --specreg 0.01 --out "$tmp/rl_sr_$actor"
    expect 0 "rl train: specreg/ quantities of the $actor actor in metrics.jsonl" \
        '"specreg/penalty": [0-9.e+-]+, "specreg/sigma_max": [0-9.e+-]+' -- cat "$tmp/rl_sr_$actor/metrics.jsonl"
    expect 0 "rl train: --specreg and --specreg-k in the $actor run's settings.json" '"specreg":[[:space:]]*0.01,.*"specreg_k":[[:space:]]*2' -- \
        tr -d '\n' < "$tmp/rl_sr_$actor/settings.json"
done
# load balancing on the MoE actor: the router's --balance weight (topk's default 0.01; the paper's Top-k: 0)
expect 0 "rl train: --balance 0.01 on the moe actor" "^rl-train env=mujoco/reach-0 agent=ppo frames=256 " -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:8,dense:8 --experts 3 --topk 2 --balance 0.01 \
    --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 1 --frames 256 --out "$tmp/rl_balance"
expect 0 "rl train: the actor routers' auxiliary loss in metrics.jsonl" '"losses/router_aux": [0-9.e+-]*[1-9]' -- \
    cat "$tmp/rl_balance/metrics.jsonl"
expect 2 "rl train: --balance < 0 is refused" "loss coefficients must be >= 0" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:8,dense:8 --experts 3 --balance -1 --frames 256
# LN: LayerNorm in the actor's hidden layers (the moe actors: factory experts, which SPHERE cannot read)
for actor in mlp moe; do
    expect 0 "rl train: --layernorm 1 on the $actor actor" "^rl-train env=mujoco/reach-0 agent=ppo frames=256 " -- \
        "$bin" rl train --env mujoco/reach-0 --agent ppo --actor $actor --arch dense:8,dense:8 --experts 3 --topk 2 \
        --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 1 --frames 256 --layernorm 1 --out "$tmp/rl_ln_$actor"
    expect 0 "rl eval: the $actor actor with LayerNorm from its checkpoint" "^rl-eval env=mujoco/reach-0 " -- \
        "$bin" rl eval "$tmp/rl_ln_$actor/checkpoint.safetensors" --episodes 1
done
expect 0 "rl train: SPHERE on the LayerNorm experts (Table 11) reports its penalty" "sphere/penalty" -- \
    sh -c "'$bin' rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:8,dense:8 --experts 3 --layernorm 1 \
    --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 1 --sphere-rho 0.001 --frames 256 --out '$tmp/rl_ln_sphere' >/dev/null &&
    cat '$tmp/rl_ln_sphere/metrics.jsonl'"
expect 0 "rl train: diagnostics on the LayerNorm moe actor (its features and specialisation metrics)" "diag/entk_srank" -- \
    sh -c "'$bin' rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:8,dense:8 --experts 3 --layernorm 1 \
    --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 1 --diag-every 1 --frames 256 --out '$tmp/rl_ln_diag' >/dev/null &&
    cat '$tmp/rl_ln_diag/metrics.jsonl'"
expect 2 "rl train: the gradient Gram on the LayerNorm experts is refused, naming them" "not factory experts. \\(LayerNorm experts\\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:8,dense:8 --experts 3 --layernorm 1 \
    --sphere-rho 0.001 --sphere-gram gradient --frames 256 --out "$tmp/rl_ln_sphere_gg"
expect 2 "rl train: --layernorm 2 is refused" "--layernorm: invalid value '2'" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --layernorm 2 --frames 256
# SPHERE's actor kinds (--actor): refusals, and each kind trains, checkpoints and evaluates
expect 2 "rl train: an unknown --actor names the kinds" "unknown actor 'bogus' \(mlp, mlp10x, moe, dense-moe, ds-moe\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor bogus --frames 256
expect 2 "rl train: --actor moe needs arch = dense:W repeated" "must then be dense:W repeated \(got 'dense:16,dense:8'\)" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor moe --arch dense:16,dense:8 --frames 256
expect 2 "rl train: --actor ds-moe needs topk >= 2" "ds-moe splits each expert in two .*topk >= 2" -- \
    "$bin" rl train --env mujoco/reach-0 --agent ppo --actor ds-moe --topk 1 --frames 256
# DS-MoE's fine-grained split keeps Top-k's parameters (DeepSeekMoE's segmentation): halving the
# width of 3-layer experts left 55% of them
expect 0 "rl train --actor ds-moe: as many parameters as the Top-k actor (within 5%)" "^same\$" -- sh -c '
    for k in moe ds-moe; do "$0" rl train --env mujoco/cheetah-run --agent ppo --actor $k --arch dense:64,dense:64,dense:64 --experts 8 \
        --topk 2 --num-steps 64 --num-minibatches 2 --update-epochs 1 --frames 64 --out "$1/dsp-$k" >/dev/null 2>&1 || exit 1
        "$0" info "$1/dsp-$k/checkpoint.safetensors" | sed -n "s/^model parameters: //p"; done | paste -sd" " |
    awk "{ r = \$2 / \$1; print (r > 0.95 && r < 1.05 ? \"same\" : \"ratio \" r) }"' "$bin" "$tmp"
for kind in moe dense-moe ds-moe mlp10x; do
    expect 0 "rl train --actor $kind: a short run" "^rl-train env=mujoco/reach-0 agent=ppo frames=256 " -- \
        "$bin" rl train --env mujoco/reach-0 --agent ppo --actor $kind --arch dense:8,dense:8 --experts 3 --topk 2 \
        --num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 1 --frames 256 --out "$tmp/rl_actor_$kind"
    expect 0 "rl eval: the --actor $kind checkpoint" "^rl-eval env=mujoco/reach-0 " -- \
        "$bin" rl eval "$tmp/rl_actor_$kind/checkpoint.safetensors" --episodes 1
done
# resets / shrink-and-perturb of the experts (SoftMoE-in-RL Sec. 6) keep exact resume: a run split
# across a reset ends in the same checkpoint bytes as the run straight through
rs_flags="--env classic/cartpole --agent dqn --arch dense:16,moe:8 --experts 2 --frames 1500 --learning-starts 200 --reset-every 500 --reset-experts 1 --reset-shrink 0.5 --reset-perturb 0.5"
expect 0 "rl train --reset-every: split before a reset" "continue with" -- "$bin" rl train $rs_flags --stop-after 800 --out "$tmp/rl_rs_split"
expect 0 "rl train --reset-every: resumed" "^rl-train " -- "$bin" rl train --resume "$tmp/rl_rs_split/checkpoint.safetensors"
expect 0 "rl train --reset-every: straight through" "^rl-train " -- "$bin" rl train $rs_flags --out "$tmp/rl_rs_straight"
expect 0 "rl train --reset-every: split and resumed equals straight through, byte for byte" "" -- \
    cmp "$tmp/rl_rs_split/checkpoint.safetensors" "$tmp/rl_rs_straight/checkpoint.safetensors"
# specmoe plot: learning curves with gnuplot; runs that differ only in the seed form one group
expect 0 "plot: RL runs, grouped over seeds" "^plot: 3 runs in 2 groups -> $tmp/curve.png" -- \
    "$bin" plot "$rl_out" "$rl_out" "$tmp/rl_split" --out "$tmp/curve.png"
expect 0 "plot: the picture is a PNG" "PNG" -- head -c 4 "$tmp/curve.png"
expect 2 "plot: no run directory is a usage error" "give one or more run directories" -- "$bin" plot
expect 1 "plot: a run without metrics is named" "nope/metrics.jsonl" -- "$bin" plot "$tmp/nope"
mkdir -p "$tmp/badlog" && printf '{"global_step": 1, "episodic_return": 2}\n{oops\n' > "$tmp/badlog/metrics.jsonl"
expect 1 "plot: a malformed metrics line is refused with file and line" "badlog/metrics.jsonl:2: not a JSON object" -- "$bin" plot "$tmp/badlog"
# specmoe report: scores over games and seeds with bootstrap intervals. Hand-made runs of two variants
# (lr 1 and 2) on two games, 2 seeds each; the score is the mean return of the episodes ending in the
# last 10% of the frames: runs end at step 1000, so the episodes at steps >= 900 count.
for v in 1 2; do for g in cartpole mountaincar; do for s in 1 2; do
    d="$tmp/rep/$g-v$v-s$s"; mkdir -p "$d"
    printf '{"env": "classic/%s", "agent": "dqn", "seed": "%s", "agent_settings": {"lr": %s}}\n' $g $s $v > "$d/settings.json"
    r=$((v * 100 + s)); [ $g = mountaincar ] && r=$((-200 + v * 10 + s))
    printf '{"global_step": 100, "episodic_return": -999}\n{"global_step": 950, "episodic_return": %s}\n{"global_step": 1000, "episodic_return": %s}\n' $r $r > "$d/metrics.jsonl"
done; done; done
expect 0 "report: the raw score per game is the mean return over the last 10% of frames, per variant" \
    "^\| lr=2 \| 201\.500 \(2\) \| -178\.500 \(2\) \|" -- "$bin" report "$tmp"/rep/* --random-episodes 20
expect 0 "report: median, IQM, mean and optimality gap with intervals, a row per variant" \
    "^\| lr=1 \| 2 x 2 \| [-0-9.]+ \[[-0-9.]+, [-0-9.]+\] \|" -- "$bin" report "$tmp"/rep/* --random-episodes 20 --reps 200
expect 0 "report: the best run normalises a game without --reference; one given is used" \
    "classic/cartpole: random [0-9.]+ \(20 episodes\), reference 500\.0000$" -- \
    "$bin" report "$tmp"/rep/* --random-episodes 20 --reference cartpole=500
expect 0 "report --out draws the intervals" "^report: intervals -> $tmp/rep.png" -- \
    "$bin" report "$tmp"/rep/* --random-episodes 20 --reps 100 --out "$tmp/rep.png"
expect 0 "report: the interval plot is a PNG" "PNG" -- head -c 4 "$tmp/rep.png"
expect 2 "report: a malformed --reference is refused" "not GAME=SCORE" -- "$bin" report "$tmp"/rep/* --reference cartpole
expect 1 "report: a directory that is not an RL run is named" "nope: no settings.json" -- "$bin" report "$tmp/nope"
# labels by settings: a network without an MoE layer keeps the router's defaults in its settings, which
# are not its own; the arch, in the agent's settings and the network's alike, is named once
for v in "dense:64 topk 8 1" "dense:64,moe:64 soft 4 1" "dense:64,moe:64 soft 4 0.1"; do
    read -r arch router experts temp <<< "$v"; d="$tmp/replab/$arch-$temp"; mkdir -p "$d"
    printf '{"env": "classic/cartpole", "agent": "dqn", "seed": "1", "agent_settings": {"arch": "%s"}, "network": {"arch": "%s", "moe": {"router": "%s", "experts": %s, "temperature": %s}}}\n' \
        "$arch" "$arch" "$router" "$experts" "$temp" > "$d/settings.json"
    printf '{"global_step": 1000, "episodic_return": 100}\n' > "$d/metrics.jsonl"
done
replab() { "$bin" report "$tmp"/replab/* --random-episodes 5 --reps 20 | sed -n 's/^| \(arch=[^|]*[^ ]\) *| 1 x 1 .*/\1/p' | LC_ALL=C sort | paste -sd'|' -; }
expect 0 "report: labels name what differs, once, and not the router defaults of a network without MoE" \
    "^arch=dense:64\|arch=dense:64,moe:64 temperature=0\.1\|arch=dense:64,moe:64 temperature=1$" -- replab
# report --claims: three variants of 3 seeds on two games. lr=2 beats lr=1 in every run; lr=3 is
# lr=1 plus half a point (about 0.002 of a game's normalised range); the verdicts follow rliable.h's rule.
for v in 1 2 3; do for g in cartpole mountaincar; do for s in 1 2 3; do
    d="$tmp/rep3/$g-v$v-s$s"; mkdir -p "$d"
    printf '{"env": "classic/%s", "agent": "dqn", "seed": "%s", "agent_settings": {"lr": %s}}\n' $g $s $v > "$d/settings.json"
    case $v in 1) r=$((100 + s)); m=$((-190 + s));; 2) r=$((300 + s)); m=$((-150 + s));; 3) r="$((100 + s)).5"; m="-$((189 - s)).5";; esac
    [ $g = mountaincar ] && r=$m
    printf '{"global_step": 1000, "episodic_return": %s}\n' $r > "$d/metrics.jsonl"
done; done; done
claims='lr=2>lr=1;lr=3~lr=1;lr=2~lr=1;lr=1!>lr=2;lr=1<lr=2;lr=1!<lr=2'
rep3() { "$bin" report "$tmp"/rep3/* --random-episodes 20 --reps 300 "$@"; }
expect 0 "report --claims: a gain in every run is reproduced" "^\| lr=2 > lr=1 \| 3 x 2 \| 0\.[0-9]+ \[0\.[0-9]+, 0\.[0-9]+\] \| 1\.000 \[1\.000, 1\.000\] \| reproduced \|\$" -- rep3 --claims "$claims"
expect 0 "report --claims: equal within the margin is reproduced" "^\| lr=3 ~ lr=1 \| 3 x 2 \| 0\.00[0-9] .*\| reproduced \|\$" -- rep3 --claims "$claims"
expect 0 "report --claims: a large difference refutes A ~ B" "^\| lr=2 ~ lr=1 \| .*\| not reproduced \|\$" -- rep3 --claims "$claims"
expect 0 "report --claims: A !> B holds when A is far worse" "^\| lr=1 !> lr=2 \| .*\| reproduced \|\$" -- rep3 --claims "$claims"
expect 0 "report --claims: A < B is B > A, A !< B is B !> A" "^\| lr=2 !> lr=1 \| .*\| not reproduced \|\$" -- rep3 --claims "$claims"
expect 0 "report --claims: too few runs per game decide nothing" "^\| lr=2 > lr=1 \| .*\| not decidable \(3 runs per game; 4 needed\) \|\$" -- \
    rep3 --claims "$claims" --min-runs 4
expect 2 "report --claims: a label no variant has is named, with the labels" "no variant is labelled 'lr=9'; the labels: 'lr=1', 'lr=2', 'lr=3'" -- \
    rep3 --claims "lr=9>lr=1"
expect 2 "report --claims: a claim without an operator is refused" "--claims: 'lr=2' is not" -- rep3 --claims "lr=2"
# A ~ B where neither learns is named: lr=4 and lr=5 play at random on both games, lr=6 and lr=7 learn
# CartPole alike and stay at random on MountainCar (-200); lr=1 learns both.
for v in 1 4 5 6 7; do for g in cartpole mountaincar; do for s in 1 2 3; do
    d="$tmp/rep4/$g-v$v-s$s"; mkdir -p "$d"
    printf '{"env": "classic/%s", "agent": "dqn", "seed": "%s", "agent_settings": {"lr": %s}}\n' $g $s $v > "$d/settings.json"
    case $v in 1) r=$((300 + s)); m=$((-150 + s));; 4|5) r=$((20 + s)); m=-200;; 6|7) r=$((250 + s)); m=-200;; esac
    [ $g = mountaincar ] && r=$m
    printf '{"global_step": 1000, "episodic_return": %s}\n' $r > "$d/metrics.jsonl"
done; done; done
rep4() { "$bin" report "$tmp"/rep4/* --random-episodes 20 --reps 300 --claims "lr=4~lr=5;lr=6~lr=7;lr=1>lr=4;lr=4!>lr=5;lr=6!<lr=7;lr=4~lr=1"; }
expect 0 "report --claims: A ~ B with both at random play on every game is said to be untested" \
    "^\| lr=4 ~ lr=5 \| .*\| reproduced \(both at random play, within the margin, on classic/cartpole, classic/mountaincar: every game, so the claim is untested\) \|\$" -- rep4
expect 0 "report --claims: the games where both are at random play are named" \
    "^\| lr=6 ~ lr=7 \| .*\| reproduced \(both at random play, within the margin, on classic/mountaincar\) \|\$" -- rep4
expect 0 "report --claims: A > B carries no such note" "^\| lr=1 > lr=4 \| .*\| reproduced \|\$" -- rep4
expect 0 "report --claims: A !> B where neither learns is named too" \
    "^\| lr=4 !> lr=5 \| .*\| reproduced \(both at random play, within the margin, on classic/cartpole, classic/mountaincar: every game, so the claim is untested\) \|\$" -- rep4
expect 0 "report --claims: A !< B, swapped to B !> A, is named on its games" \
    "^\| lr=7 !> lr=6 \| .*\| reproduced \(both at random play, within the margin, on classic/mountaincar\) \|\$" -- rep4
expect 0 "report --claims: a refuted A ~ B carries no note" "^\| lr=4 ~ lr=1 \| .*\| not reproduced \|\$" -- rep4
# report --curves: the IQM over training. Two variants x two games x 3 seeds: an early episode at frame
# 300 and the scored ones at 950 and 1000, so at --curve-every 500 the last point holds exactly the
# episodes the table scores (its IQM must be the table's), and lr=1 s3 on CartPole has no early one.
for v in 1 2; do for g in cartpole mountaincar; do for s in 1 2 3; do
    d="$tmp/repc/$g-v$v-s$s"; mkdir -p "$d"
    printf '{"env": "classic/%s", "agent": "dqn", "seed": "%s", "agent_settings": {"lr": %s}}\n' $g $s $v > "$d/settings.json"
    case $v in 1) e=$((20 + s)); r=$((100 + s)); m=$((-190 + s));; 2) e=$((100 + s)); r=$((300 + s)); m=$((-150 + s));; esac
    [ $g = mountaincar ] && e=-200 && r=$m
    { [ "$g-$v-$s" = cartpole-1-3 ] || printf '{"global_step": 300, "episodic_return": %s}\n' $e
      printf '{"global_step": 950, "episodic_return": %s}\n{"global_step": 1000, "episodic_return": %s}\n' $r $((r + 2)); } > "$d/metrics.jsonl"
done; done; done
repc() { "$bin" report "$tmp"/repc/* --random-episodes 20 --reps 300 --curves "$tmp/repc.png" --curve-every 500 "$@"; }
expect 0 "report --curves: the last point, holding the scored episodes, is the table's IQM" "^same [0-9.]+\$" -- sh -c '
    out=$("$@") && t=$(echo "$out" | sed -n "s/^| lr=2 | 3 x 2 | [^|]*| \([-0-9.]*\) .*/\1/p") &&
    c=$(echo "$out" | sed -n "s/^| 1000 | [^|]*| \([-0-9.]*\) .*/\1/p") && [ -n "$t" ] && [ "$t" = "$c" ] && echo "same $t"' sh \
    "$bin" report "$tmp"/repc/* --random-episodes 20 --reps 300 --curves "$tmp/repc.png" --curve-every 500
expect 0 "report --curves: a point where a run had no episode end is left out" "^\| 500 \| - \| [-0-9.]+ \[[-0-9.]+, [-0-9.]+\] \|\$" -- repc
expect 0 "report --curves: learning shows as a rising curve" "^rising\$" -- sh -c '
    out=$("$@") && a=$(echo "$out" | sed -n "s/^| 500 | [^|]*| \([-0-9.]*\) .*/\1/p") &&
    b=$(echo "$out" | sed -n "s/^| 1000 | [^|]*| \([-0-9.]*\) .*/\1/p") && awk -v a="$a" -v b="$b" "BEGIN { if (b > a) print \"rising\" }"' sh \
    "$bin" report "$tmp"/repc/* --random-episodes 20 --reps 300 --curves "$tmp/repc.png" --curve-every 500
expect 0 "report --curves: the curve plot is a PNG" "PNG" -- head -c 4 "$tmp/repc.png"
expect 2 "report --curve-every: at least one frame" "--curve-every must be in" -- repc --curve-every 0
mkdir -p "$tmp/repc-arch" && cp "$tmp/repc/cartpole-v1-s1/settings.json" "$tmp/repc-arch/" &&
    printf '{"global_step": 50000, "curve_return": 20, "curve_episodes": 3}\n{"global_step": 50000, "episodic_return": 20}\n' > "$tmp/repc-arch/metrics.jsonl"
expect 1 "report --curves: an archived curve is read at its own step only, naming the run" \
    "repc-arch/metrics.jsonl: an archived curve \(curve_return records, kept every 50000 frames\) cannot be read at --curve-every 25000" -- \
    "$bin" report "$tmp/repc-arch" --random-episodes 5 --curves "$tmp/repc-arch.png" --curve-every 25000
# two variants with runs of one game each: neither has runs of every game, so neither has a point
expect 0 "report --curves: with no point to draw, says so and exits 0" "^report: no point of any variant to draw; .*repc-none.png not written\$" -- \
    "$bin" report "$tmp"/repc/cartpole-v1-s* "$tmp"/repc/mountaincar-v2-s* --random-episodes 5 --reps 20 --curves "$tmp/repc-none.png" --curve-every 500
expect 2 "rl eval without --env names the environments" "--env is required .*classic/cartpole" -- "$bin" rl eval --policy random
expect 0 "bench env runs on one environment" "^bench-env env=classic/mountaincar threads=1 steps_per_s=[0-9]+ steps_per_cpu_s=[0-9]+\$" -- \
    "$bin" bench env --env classic/mountaincar --steps 20000 --envs 8
expect 0 "bench env --mj-bare: a MuJoCo environment against bare mj_step at its frame skip" \
    "^bench-env-mj env=mujoco/reach-0 threads=1 frame_skip=2 bare_steps_per_s=[0-9]+ bare_steps_per_cpu_s=[0-9]+ ratio_cpu=[0-9.]+\$" -- \
    "$bin" bench env --env mujoco/reach-0 --steps 2000 --envs 4 --mj-bare
expect 2 "bench env: an unknown environment is refused, naming the valid ones" "unknown environment 'x' .*classic/acrobot" -- "$bin" bench env --env x
expect 2 "bench env: --steps 0 refused" "must be >= 1" -- "$bin" bench env --steps 0
expect 0 "bench gemm: a line per RL shape with its fraction of the FMA peak" "^bench-gemm M=32 K=1024 N=128 us_per_call=[0-9.]+ gflops=[0-9.]+ peak_fraction=" -- \
    "$bin" bench gemm --seconds 0.01
expect 0 "bench gemm: the MinAtar conv's packed and OpenBLAS paths side by side" "^bench-gemm-conv B=32 C=4 H=10 W=10 OC=16 K=3 pad=0 product=bwd openblas_us=[0-9.]+ packed_us=[0-9.]+ .* packed=[01]" -- \
    "$bin" bench gemm --seconds 0.01
expect 2 "unknown flag"              "unknown flag '--nope'" -- "$bin" train --nope 1
expect 2 "bad number"                "--lr: 'abc' is not"    -- "$bin" train --lr abc
expect 2 "missing value"             "needs a value"         -- "$bin" train --lr
# numbers are decimal and finite; the learning-rate schedule never rises nor goes below 0
expect 2 "hex number refused"        "--lr: '0x10' is not a valid decimal number" -- "$bin" train --lr 0x10 --out "$tmp/hex"
expect 2 "inf refused"               "--lr: 'inf' is not"    -- "$bin" train --lr inf
expect 2 "nan refused"               "--clip: 'nan' is not"  -- "$bin" train --clip nan
expect 2 "negative --final-lr refused" "--final-lr must be >= 0" -- "$bin" train --final-lr -1 --per-class 5 --epochs 1 --out "$tmp/flr"
expect 2 "--final-lr above --lr refused" "--final-lr \(0.01\) must not exceed --lr \(0.001\)" -- "$bin" train --final-lr 0.01 --lr 0.001 --per-class 5 --epochs 1 --out "$tmp/flr"
expect 2 "train --threads 0 refused" "--threads must be >= 1" -- "$bin" train --threads 0 --per-class 5 --epochs 1 --out "$tmp/thr"
expect 2 "eval --threads -1 refused" "--threads must be >= 1" -- "$bin" eval "$root/tests/data/ckpt_v0_topk.safetensors" --threads -1
# SPHERE in the supervised loop (train --sphere-rho: sm_train's after_backward calls sm_sphere_step)
sph_train="--arch moehead:16:1:16 --experts 4 --topk 2 --balance 0 --per-class 20 --epochs 1 --batch 32 --seed 3 --log-every 1"
expect 0 "train --sphere-rho: SPHERE changes the training of an MoE classifier" "^different$" -- \
    sh -c "'$bin' train $sph_train --out '$tmp/sph0' >/dev/null && '$bin' train $sph_train --sphere-rho 0.01 --out '$tmp/sph1' >/dev/null &&
           a=\$(grep -o '\"loss\":[^,]*' '$tmp/sph0/metrics.jsonl' | tail -1) && b=\$(grep -o '\"loss\":[^,]*' '$tmp/sph1/metrics.jsonl' | tail -1) &&
           [ -n \"\$a\" ] && [ \"\$a\" != \"\$b\" ] && echo different"
expect 2 "train --sphere-rho on a soft router is refused" "needs a top-k \(sparse\) router \(router soft\)" -- \
    "$bin" train --router soft --sphere-rho 0.01 --per-class 5 --epochs 1 --out "$tmp/sph2"
expect 2 "train --sphere-mode: an unknown mode is refused" "--sphere-mode: 'foo' is not grad, loss or fixed" -- \
    "$bin" train --sphere-mode foo --per-class 5 --epochs 1 --out "$tmp/sph3"
expect 0 "train --help lists --sphere-gram" "--sphere-gram STR +SPHERE's Gram: feature \(Eq. 19\) or gradient" -- "$bin" train --help
expect 2 "train --sphere-gram: an unknown Gram is refused" "--sphere-gram: 'grad' is not feature or gradient" -- \
    "$bin" train --sphere-gram grad --per-class 5 --epochs 1 --out "$tmp/sph4"
expect 0 "train --sphere-gram gradient: SPHERE on the backprop vectors' Gram of a moehead classifier" "^final test accuracy" -- \
    sh -c "'$bin' train $sph_train --sphere-rho 0.01 --sphere-gram gradient --out '$tmp/sph5' &&
           grep -q '\"sphere-gram\":\s*\"gradient\"' '$tmp/sph5/settings.json'"
expect 2 "train --sphere-gram gradient with relu-less experts is refused" "exact for ReLU experts only" -- \
    "$bin" train $sph_train --expert-act tanh --sphere-rho 0.01 --sphere-gram gradient --out "$tmp/sph6"
expect 2 "eval --per-class -1 refused" "--per-class" -- "$bin" eval "$root/tests/data/ckpt_v0_topk.safetensors" --per-class -1
expect 2 "a trailing comma in --arch refused" "empty layer" -- "$bin" train --arch dense:256, --per-class 5 --epochs 1 --out "$tmp/arch"
expect 2 "k > E refused"             "top-k must be in"      -- "$bin" train --experts 4 --topk 5
expect 2 "temperature <= 0 refused"  "temperature must be > 0" -- "$bin" train --temperature 0
expect 2 "capacity < 0 refused"      "capacity factor"       -- "$bin" train --capacity -1
expect 2 "capacity = 0 refused"      "capacity factor must be > 0" -- "$bin" train --capacity 0
expect 2 "bad arch refused"          "unknown layer kind"    -- "$bin" train --arch convo:3
expect 2 "conv without its numbers refused" "takes 4 number"  -- "$bin" train --arch conv:3
expect 2 "kernel larger than its input refused" "larger than"  -- "$bin" train --arch conv:4:40:1:0,dense:8 --per-class 5
expect 2 "tau <= 0 refused"          "temperature must be > 0" -- "$bin" train --model srmoe --tau 0
expect 2 "zero experts refused"      "number of experts"     -- "$bin" train --model srmoe --experts 0
# output paths are checked before the data are loaded: an empty one is a usage error, an unwritable
# one a runtime error naming it
expect 2 "train --out '' refused" "--out: the path is empty" -- "$bin" train --out "" --per-class 5 --epochs 1
touch "$tmp/afile"
expect 1 "train --out under a file refused before loading data, naming the path" "afile/run: cannot create run directory" -- \
    "$bin" train --out "$tmp/afile/run" --per-class 5 --epochs 1 --data "$tmp/nodata"
mkdir -p "$tmp/ro" && chmod 555 "$tmp/ro"
if [ ! -w "$tmp/ro" ]; then
    expect 1 "train --out in a read-only directory refused before loading data" "ro/metrics.jsonl: cannot create" -- \
        "$bin" train --out "$tmp/ro" --per-class 5 --epochs 1 --data "$tmp/nodata"
fi
expect 2 "more than 4 stem convolutions refused" "--stem: at most 4" -- "$bin" train --model srmoe --stem 8,8,8,8,8 --per-class 5 --epochs 1 --out "$tmp/stem"
expect 2 "unknown class refused"     "class"                 -- "$bin" train --classes 3,12
expect 2 "unknown class name refused" "unknown class 'Boot'" -- "$bin" train --classes Bag,Boot
expect 1 "out of memory is a runtime error (exit 1), not a usage error" "cannot allocate|needs about" -- "$bin" train --arch dense:1000000,dense:1000000 --per-class 5 --out "$tmp/oom"
# a model far larger than memory is refused before anything is allocated, with the estimate
expect 1 "a model larger than memory is refused with the estimate" \
    "the model needs about [0-9.]+ GiB to train \(421277998762 parameters: 1569.4 GiB x 4 .* but this machine has [0-9.]+ GiB available" -- \
    "$bin" train --arch moe:4096 --experts 65536 --per-class 5 --out "$tmp/huge"
expect 2 "a boolean flag is a plain switch (--noisy then --temperature 0 reaches the temperature check)" "temperature must be > 0" -- "$bin" train --noisy --temperature 0
expect 2 "after a plain boolean switch a non-word is an argument, not its value" "unexpected argument 'maybe'" -- "$bin" train --noisy maybe
expect 2 "unknown router refused"    "unknown router"        -- "$bin" train --router nope
expect 2 "unknown optimiser refused" "unknown optimiser"     -- "$bin" train --optim lion
expect 2 "bad class list refused"    "class"                 -- "$bin" train --classes 3,3
expect 2 "bad bench shapes refused"  "--shapes"              -- "$bin" bench layer --shapes 1,2,3
# the roofline: a measured step can never beat the expert GEMMs' FLOPs at the measured peak, so a
# floor above the step time, or plain sgemm above the peak, would mean the peak is wrong
out=$("$bin" bench layer --shapes 64,32,64,4,2 --seconds 0.05 --routing 0 2>&1)
if echo "$out" | awk '/^bench-peak /    { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] } peak = f["peak_gflops"] + 0 }
                     /^bench-layer /   { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
                                         ms = f["ms_per_step"] + 0; fl = f["floor_ms"] + 0; sg = f["sgemm_gflops"] + 0; seen = 1 }
                     END { exit !(seen && peak > 1 && fl > 0 && fl < ms && sg < peak) }'; then
    ok "bench layer: measured peak bounds the step and plain sgemm"
else
    bad "bench layer: measured peak bounds the step and plain sgemm" "$(echo "$out" | head -n 3)"
fi
mkdir -p "$tmp/nodir" && (cd "$tmp/nodir" && "$bin" train --data "$tmp/nonexistent" --epochs 1 >/dev/null 2>&1)
expect 1 "missing data dir"          "specmoe: .*nonexistent" -- "$bin" train --data "$tmp/nonexistent" --epochs 1
[ -z "$(ls -A "$tmp/nodir/runs" 2>/dev/null)" ] && ok "a run refused before training leaves no run directory behind" \
    || bad "a run refused before training leaves no run directory behind" "$(ls "$tmp/nodir/runs")"
expect 1 "info on a missing file"    "specmoe: "             -- "$bin" info "$tmp/none.safetensors"
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a":' > "$tmp/trunc.safetensors"
expect 1 "info on a truncated file"  "specmoe: .*trunc"      -- "$bin" info "$tmp/trunc.safetensors"

# routers: impossible settings are refused before any work (exit 2)
expect 2 "k_r > d refused"           "routing rank k_r must be in"  -- "$bin" train --router grassmann --kr 300
expect 2 "alpha < 0 refused"         "alpha .* must be >= 0"        -- "$bin" train --router grassmann --alpha -1
expect 2 "a flag of another router refused, naming its routers" "--kr is an option of the grassmann router, not of topk" \
    -- "$bin" train --router topk --kr 8
expect 2 "a flag two routers own names both" "--kappa-init is an option of the vmf, grassmann routers, not of soft" \
    -- "$bin" train --router soft --kappa-init 2
expect 0 "eval's dial flags come from the routers' tables" "--alpha .*grassmann, ev" -- "$bin" eval --help
expect 2 "switch with k > 1 refused" "exactly one expert"           -- "$bin" train --router switch --topk 2 --per-class 10 --epochs 1 --out "$tmp/sw"
expect 0 "bingham-z prints saddle point and Monte Carlo" "kappa" -- "$bin" bingham-z --kappa 1 --samples 20000
expect 2 "bingham-z k_r > d refused"  ""                            -- "$bin" bingham-z --d 4 --kr 5
out=$("$bin" bench routing --seeds 1 --steps 20 --test-tokens 256 --out "$tmp/br" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c '^| ')" -eq 9 ] && [ -s "$tmp/br/routing_easy.json" ]; then
    ok "bench routing runs all eight methods and writes Markdown + JSON"
else
    bad "bench routing runs all eight methods and writes Markdown + JSON" "exit $rc: $(echo "$out" | tail -n 3)"
fi
# long benchmarks print a progress line per finished run, so a user sees they are alive
[ "$(echo "$out" | grep -cE '^bench routing: \[[1-8]/8\] .* seed 0 done: acc')" -eq 8 ] \
    && ok "bench routing prints a progress line per run" || bad "bench routing prints a progress line per run" "$(echo "$out" | head -n 2)"
expect 2 "bench routing: unknown setting refused" "unknown setting" -- "$bin" bench routing --setting medium
expect 2 "bench routing: an unknown method is refused listing the methods" \
    "unknown method 'bogus' .*0 Softmax Top-1, 1 Switch.*7 GrMoE \+ Amort" -- "$bin" bench routing --methods bogus
expect 2 "bench routing: a method index out of range is refused" "unknown method '8'" -- "$bin" bench routing --methods 1,8
# --- GrMoE bench routing: ceilings and the flags for what the paper leaves open (issue 16) ---
br() { "$bin" bench routing --seeds 1 --steps 5 --test-tokens 256 --out "$tmp/br16" "$@"; }
expect 2 "bench routing: --kr beyond d refused"        "--kr must be in 1..d"                 -- br --kr 129
expect 2 "bench routing: negative --kr refused"        "--kr must be in 1..d"                 -- br --kr -3
expect 2 "bench routing: --router-kr beyond d refused" "--router-kr must be in 0..d"          -- br --router-kr 200
expect 2 "bench routing: unknown --overlap refused"    "unknown overlap construction 'bogus' \(tilt\|shared\)" -- br --overlap bogus
expect 2 "bench routing: negative --mean refused"      "--mean must be a finite number >= 0"  -- br --mean -1
expect 2 "bench routing: --vocab below N refused"      "--vocab must be 0 or >= N"            -- br --vocab 3
expect 2 "bench routing: --kappa-init 0 refused"       "--kappa-init must be a finite number > 0" -- br --kappa-init 0
expect 2 "bench routing: unknown --threshold refused"  "unknown threshold 'rho' \(eq12 or appc\)" -- br --threshold rho
expect 2 "bench routing: negative --rho0 refused"      "--rho0 must be a finite number >= 0"  -- br --rho0 -0.1
expect 2 "bench routing: --probe-hidden 0 refused"     "--probe-hidden must be >= 1"          -- br --probe-hidden 0
expect 2 "bench routing: a non-number --mean refused"  "mean"                                 -- br --mean abc
# the ceilings alone: the easy task's Bayes rule is perfect; they are written to the JSON too
expect 0 "bench routing: the Bayes ceiling is printed beside the table" \
    "Bayes rule with the true subspaces.*: 100\.0 ± 0\.0%" -- br --methods none
grep -q '"ceilings":{"probe_hidden":128,"bayes":1' "$tmp/br16/routing_easy.json" \
    && ok "bench routing: the ceilings are in the JSON" || bad "bench routing: the ceilings are in the JSON" "$(cat "$tmp/br16/routing_easy.json")"
expect 0 "bench routing: the hard setting defaults to k_r = 40" "hard: N=8, d=128, k_r=40, rho\*=0.40" -- br --setting hard --methods none --ceilings 0
expect 0 "bench routing: App. C's threshold is 10% of the random overlap" \
    "overlap threshold 0.2 \(App. C: 0.1 k_r\^2/d; random overlap k_r\^2/d = 2\)" -- br --methods GrMoE --threshold appc --ceilings 0
expect 0 "bench routing: Eq. 12's threshold is rho0 k_r" "overlap threshold 8 \(Eq. 12" -- br --methods GrMoE --rho0 0.5 --ceilings 0
expect 0 "bench routing: the token-identity variant runs" "^\| Hash \| [0-9.]+ ±" -- br --methods Hash --vocab 16 --ceilings 0
expect 0 "bench routing: the token-identity variant is named in the header" "16 token ids" -- br --methods none --vocab 16 --ceilings 0
expect 0 "bench routing: a target overlap the construction cannot reach is said" "cannot reach rho\* = 0.10" -- br --methods none --kr 32 --ceilings 0
expect 0 "bench routing: the merge column is in the table" "\| Collapse \| Merge \|" -- br --methods GrMoE --overlap shared --mean 2 --ceilings 0
out=$("$bin" bench alpha --seeds 2 --steps 20 --test-tokens 256 --out "$tmp/ba" 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q "monotone" && [ -s "$tmp/ba/alpha_easy.png" ]; then
    ok "bench alpha sweeps the dials, reports monotonicity and draws the PNG"
else
    bad "bench alpha sweeps the dials, reports monotonicity and draws the PNG" "exit $rc: $(echo "$out" | tail -n 3)"
fi
[ "$(echo "$out" | grep -cE '^bench alpha: \[[1-4]/4\] .* seed [01] done')" -eq 4 ] \
    && ok "bench alpha prints a progress line per run" || bad "bench alpha prints a progress line per run" "$(echo "$out" | head -n 2)"

if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    run="$tmp/run"
    out=$("$bin" train --per-class 300 --epochs 2 --arch dense:64,moe:32 --experts 4 --topk 2 --capacity 1.5 \
          --shared 1 --log-every 10 --warmup 0 --lr 3e-3 --out "$run" --threads 1 2>"$tmp/train.err"); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "final test accuracy" && echo "$out" | grep -q "peak memory"; then
        ok "short Fashion-MNIST training run"
    else
        bad "short Fashion-MNIST training run" "exit $rc: $(tail -n 3 "$tmp/train.err")"
    fi
    grep -qE '^step [0-9]+/[0-9]+ epoch' "$tmp/train.err" && ok "plain progress lines when stderr is not a terminal" \
        || bad "plain progress lines when stderr is not a terminal"
    echo "$out" | grep -q "load per expert" && ok "routing statistics printed" || bad "routing statistics printed"
    # the final test accuracy is the last record of metrics.jsonl
    tacc=$(tail -n 1 "$run/metrics.jsonl" | sed -nE 's/^\{"kind":"test",.*"accuracy":([0-9.e-]+),.*/\1/p')
    pacc=$(echo "$out" | sed -nE 's/^final test accuracy: ([0-9.]+).*/\1/p')
    [ -n "$tacc" ] && awk -v a="$tacc" -v b="$pacc" 'BEGIN { d = a - b; exit !(d < 5e-5 && d > -5e-5) }' \
        && ok "metrics.jsonl ends with the test accuracy ($tacc)" || bad "metrics.jsonl ends with the test accuracy" "'$tacc' vs $pacc"
    # without a validation set the best checkpoint is the epoch with the lowest mean training loss
    echo "$out" | grep -qE "^best checkpoint: .*run/best.safetensors \(step (24|48), epoch mean training loss" && [ -s "$run/best.safetensors" ] \
        && ok "best.safetensors by training loss without --val-size" || bad "best.safetensors by training loss without --val-size" "$(echo "$out" | grep best)"
    expect 0 "a warm-up longer than the run is warned about" "warning: --warmup 500 is longer than the run \\(20 steps\\)" -- \
        "$bin" train --per-class 20 --epochs 1 --batch 10 --warmup 500 --arch dense:8,moe:8 --experts 2 --out "$tmp/warm" --threads 1
    # the load-balancing loss is on by default for topk (0.01), and the summary says routing is healthy
    echo "$out" | grep -q "routing healthy: every expert gets >= 1% of tokens" && ok "the default topk run reports healthy routing" \
        || bad "the default topk run reports healthy routing" "$(echo "$out" | grep 'moe layer' | head -n 3)"
    head -c 8192 "$run/checkpoint.safetensors" | grep -aq 'balance\\":0.01,' \
        && ok "topk stores its default balance coefficient 0.01" || bad "topk stores its default balance coefficient 0.01"
    [ -s "$run/metrics.jsonl" ] && head -n 1 "$run/metrics.jsonl" | grep -q '"load":\[' && ok "metrics.jsonl written" \
        || bad "metrics.jsonl written"
    [ -s "$run/checkpoint.safetensors" ] && [ ! -e "$run/checkpoint.safetensors.tmp" ] && ok "checkpoint written atomically" \
        || bad "checkpoint written atomically"
    expect 0 "info prints model and tensor table" "layers.1.experts.w1 +F32 +\[4,32,64\]" -- "$bin" info "$run/checkpoint.safetensors"
    acc=$(echo "$out" | sed -nE 's/^final test accuracy: ([0-9.]+).*/\1/p')
    [ -n "$acc" ] || { bad "the training run printed its final test accuracy"; acc=missing; }
    eval_out=$("$bin" eval "$run/checkpoint.safetensors" --threads 1 2>&1)
    echo "$eval_out" | grep -q "test accuracy: $acc" && ok "eval reproduces the final test accuracy ($acc)" \
        || bad "eval reproduces the final test accuracy" "$acc vs $(echo "$eval_out" | tail -n 1)"
    expect 0 "eval --spread 1 prints each layer's spread across examples" \
        "^layer 1 \(moe, [0-9]+ features\): spread across examples [0-9.e+-]+, constant features [0-9]+" -- \
        "$bin" eval "$run/checkpoint.safetensors" --spread 1 --per-class 20 --threads 1
    # SSMoE: the eigenvector router built from the checkpoint's own experts; alpha 0 is the learned router
    expect 0 "eval --router ev --alpha 0 reproduces the top-k model" "test accuracy: $acc" -- \
        "$bin" eval "$run/checkpoint.safetensors" --router ev --alpha 0 --threads 1
    expect 0 "eval --router ev --alpha 0: the learned router picks every expert the mix picks (D.6 overlap 1)" \
        "moe layer 0: 1.0000 of the experts picked" -- "$bin" eval "$run/checkpoint.safetensors" --router ev --alpha 0 --threads 1
    expect 0 "eval --router ev builds the descriptors" "ev router: descriptors built" -- \
        "$bin" eval "$run/checkpoint.safetensors" --router ev --alpha 0.5 --ev-c 3 --threads 1
    expect 2 "training with the ev router refused" "built from a trained topk model" -- "$bin" train --router ev
    expect 0 "ssmoe prune writes a checkpoint with 3 of 4 experts" "3 of 4 experts" -- \
        "$bin" ssmoe prune "$run/checkpoint.safetensors" --keep 0.75 --rank ssmoe --calib 200 --out "$tmp/pruned.safetensors"
    expect 0 "the pruned checkpoint has the experts physically removed" "layers.1.experts.w1 +F32 +\[3,32,64\]" -- \
        "$bin" info "$tmp/pruned.safetensors"
    expect 0 "the pruned checkpoint evaluates" "test accuracy: 0\." -- "$bin" eval "$tmp/pruned.safetensors" --threads 1
    expect 2 "ssmoe prune: unknown ranking refused" "--rank" -- "$bin" ssmoe prune "$run/checkpoint.safetensors" --rank best --out "$tmp/x"
    out=$("$bin" bench ssmoe --seeds 1 --epochs 1 --configs 4:2 --arch dense:16,moe:16,moe:16 --alphas 0,1 --cs 5 \
          --calib 100 --threads 1 --out "$tmp/bs" 2>&1); rc=$?
    if [ $rc -eq 0 ] && [ -s "$tmp/bs/ssmoe.json" ] && echo "$out" | grep -q "SSMoE-drop"; then
        ok "bench ssmoe compares the methods and writes Markdown + JSON"
    else
        bad "bench ssmoe compares the methods and writes Markdown + JSON" "exit $rc: $(echo "$out" | tail -n 3)"
    fi
    # checkpoints written by the code before the module refactor (commit 007f635, one thread) load and
# evaluate to the accuracy that code printed for them
for fx in "topk 0.6506" "grassmann 0.6136" "srmoe 0.2091"; do
    read -r kind facc <<< "$fx"
    expect 0 "a $kind checkpoint from before the module refactor evaluates to $facc" "test accuracy: $facc " -- \
        "$bin" eval "$root/tests/data/ckpt_v0_$kind.safetensors" --threads 1
done
# eval --per-class N evaluates on at most N images of each class
expect 0 "eval --per-class evaluates on at most N images per class" "test accuracy: [0-9.]+ \(loss [0-9.]+, 30 examples\)" -- \
    "$bin" eval "$root/tests/data/ckpt_v0_topk.safetensors" --per-class 3 --threads 1
expect 2 "bench ssmoe: k > E refused" "" -- "$bin" bench ssmoe --configs 16:20
    expect 0 "bench ssmoe-build times the EV build of a SwiGLU layer" "bench-ssmoe-build experts=3" -- \
        "$bin" bench ssmoe-build --experts 3 --d 64 --inter 32 --ev-c 5
    expect 0 "bench ssmoe-build prints its progress" "bench ssmoe-build: \[3/3\] experts built" -- \
        "$bin" bench ssmoe-build --experts 3 --d 64 --inter 32 --ev-c 5
    # resume takes the run's saved settings; a typed one that differs is a usage error naming it
    expect 2 "resume with other model flags refused, naming the flag" \
        "--experts 8 conflicts with the checkpoint's 4 \(resume keeps the run's settings\)" -- \
        "$bin" train --per-class 300 --epochs 3 --arch dense:64,moe:32 --experts 8 --out "$tmp/run2" --resume "$run/checkpoint.safetensors"
    for c in "--optim sgd:adamw" "--batch 64:128" "--seed 2:1" "--classes 0,1:all" "--per-class 30:300" "--router switch:topk"; do
        expect 2 "resume refuses ${c%%:*} (the run's ${c##*:})" "${c%%:*} conflicts with the checkpoint's ${c##*:} " -- \
            "$bin" train --resume "$run/checkpoint.safetensors" --out "$tmp/run2" ${c%%:*}
    done
    [ ! -e "$tmp/run2" ] && ok "a refused resume writes nothing" || bad "a refused resume writes nothing" "$(ls "$tmp/run2")"
    # a checkpoint written before settings were saved: the flags describe its model, and a mismatch is
    # a usage error too
    expect 2 "resume of an older checkpoint with other model flags is a usage error" "does not match the requested one" -- \
        "$bin" train --resume "$root/tests/data/ckpt_v0_topk.safetensors" --per-class 5 --out "$tmp/old" --threads 1
    # resuming with no flag at all continues the run exactly: the same result as the uninterrupted run
    # (optimiser, batch, seed, schedule and model all come from the checkpoint)
    cfg="--per-class 30 --epochs 2 --arch dense:16,moe:8 --experts 4 --optim sgd --lr 0.01 --batch 32 --seed 5 --warmup 0 --threads 1"
    u=$("$bin" train $cfg --out "$tmp/whole" 2>/dev/null | grep '^final test accuracy')
    "$bin" train $cfg --stop-after 3 --out "$tmp/half" >/dev/null 2>&1
    r=$(cd "$tmp" && "$bin" train --resume half/checkpoint.safetensors 2>/dev/null)
    [ -n "$u" ] && [ "$(echo "$r" | grep '^final test accuracy')" = "$u" ] && echo "$r" | grep -q "^trained 17 steps" \
        && ok "resume without flags takes the saved settings and matches the uninterrupted run" \
        || bad "resume without flags takes the saved settings and matches the uninterrupted run" "$u vs $(echo "$r" | tail -n 3)"
    echo "$r" | grep -q "run directory half " && [ "$(grep -c '"kind":"train"' "$tmp/half/metrics.jsonl")" -ge 2 ] \
        && ok "resume without --out goes on in the checkpoint's directory" \
        || bad "resume without --out goes on in the checkpoint's directory" "$(echo "$r" | head -n 1)"
    # settings.json: every flag with its value, defaults included, and the names typed
    grep -q '"optim":.*"sgd"' "$tmp/whole/settings.json" && grep -q '"weight-decay":.*0.0001' "$tmp/whole/settings.json" \
        && grep -q '"given":' "$tmp/whole/settings.json" && ok "settings.json holds every flag, defaults included" \
        || bad "settings.json holds every flag, defaults included"
    # without --out, every run gets a new directory runs/train-DATE-TIME[-N]; nothing is overwritten
    mkdir -p "$tmp/cwd" && for i in 1 2; do (cd "$tmp/cwd" && "$bin" train --per-class 5 --epochs 1 --arch dense:8 --threads 1 >/dev/null 2>&1); done
    n=$(ls -d "$tmp"/cwd/runs/train-2*/ 2>/dev/null | wc -l)
    [ "$n" = 2 ] && [ "$(ls "$tmp"/cwd/runs/train-*/checkpoint.safetensors | wc -l)" = 2 ] \
        && ok "without --out each run writes to a new directory under runs/" \
        || bad "without --out each run writes to a new directory under runs/" "$(ls "$tmp/cwd/runs" 2>&1)"
    # a dense checkpoint (no MoE layer) has no experts to route by eigenvectors or to prune
    "$bin" train --arch dense:16 --per-class 10 --epochs 1 --out "$tmp/dense" --threads 1 >/dev/null 2>&1
    expect 2 "eval --router ev on a dense checkpoint refused" "the checkpoint has no MoE layer" -- \
        "$bin" eval "$tmp/dense/checkpoint.safetensors" --router ev --threads 1
    expect 2 "ssmoe prune on a dense checkpoint refused" "the checkpoint has no MoE layer" -- \
        "$bin" ssmoe prune "$tmp/dense/checkpoint.safetensors" --out "$tmp/dense-pruned.safetensors"
    # a model trained on a class subset is evaluated on that subset (1000 test images per class)
    "$bin" train --classes 0,1,7,8 --per-class 20 --epochs 1 --arch dense:16 --out "$tmp/cls" --threads 1 >/dev/null 2>&1
    expect 0 "eval uses the class subset stored in the checkpoint" "test accuracy: [0-9.]+ \(loss [0-9.]+, 4000 examples\)" -- \
        "$bin" eval "$tmp/cls/checkpoint.safetensors" --threads 1
    expect 0 "eval --classes overrides the stored subset" "test accuracy: [0-9.]+ \(loss [0-9.]+, 10000 examples\)" -- \
        "$bin" eval "$tmp/cls/checkpoint.safetensors" --classes all --threads 1
    # the NaN guard after --resume A --out B, before B holds a checkpoint, names A (with its step)
    # (A stops in the middle of its first epoch: 3 steps of 128 of 300 examples)
    "$bin" train --per-class 30 --epochs 2 --stop-after 1 --arch dense:16,moe:8 --experts 4 --out "$tmp/nanA" --threads 1 >/dev/null 2>&1
    expect 1 "the NaN guard after a resume names the resumed checkpoint while --out has none" \
        "last good checkpoint: $tmp/nanA/checkpoint.safetensors \(step 1\)" -- "$bin" train --per-class 30 --epochs 2 \
        --arch dense:16,moe:8 --experts 4 --resume "$tmp/nanA/checkpoint.safetensors" --out "$tmp/nanB" --fault-nan-step 1 --threads 1
    # after a resume, the throughput line counts this run's steps only (5 of the 6)
    expect 0 "after a resume, 'trained N steps' counts this run's steps only" "^trained 5 steps in" -- \
        "$bin" train --per-class 30 --epochs 2 --arch dense:16,moe:8 --experts 4 --resume "$tmp/nanA/checkpoint.safetensors" \
        --out "$tmp/nanC" --threads 1
    # a metrics.jsonl that cannot be written (disk full) is a runtime error naming it
    mkdir -p "$tmp/full" && ln -s /dev/full "$tmp/full/metrics.jsonl"
    expect 1 "a failed write of metrics.jsonl (disk full) is a runtime error naming the file" \
        "full/metrics.jsonl: cannot write: No space left on device" -- "$bin" train --per-class 10 --epochs 1 \
        --arch dense:16,moe:8 --experts 4 --out "$tmp/full" --threads 1
    # --val-size validates at the end of every epoch, the last one (the saved model) too, labelled with
    # the epoch it closes (the epoch of that epoch's train records)
    "$bin" train --per-class 100 --epochs 3 --val-size 200 --arch dense:16,moe:8 --experts 4 --out "$tmp/val3" \
        --threads 1 >/dev/null 2>&1
    v=$(grep '"kind":"val"' "$tmp/val3/metrics.jsonl" 2>/dev/null | sed -nE 's/.*"step":([0-9]+),"epoch":([0-9]+).*/\1:\2/p' | tr '\n' ' ')
    [ "$v" = "7:0 14:1 21:2 " ] && ok "--val-size validates after every epoch, the last too, with its epoch" \
        || bad "--val-size validates after every epoch, the last too, with its epoch" "step:epoch = $v"
    "$bin" train --per-class 100 --epochs 1 --val-size 200 --arch dense:16,moe:8 --experts 4 --out "$tmp/val1" \
        --threads 1 >/dev/null 2>&1
    v=$(grep -c '"kind":"val"' "$tmp/val1/metrics.jsonl" 2>/dev/null)
    [ "$v" = 1 ] && ok "--val-size with one epoch validates the final model" \
        || bad "--val-size with one epoch validates the final model" "$v validation records"
    # the best checkpoint (highest validation accuracy, the first of equals) is kept beside the last
    want=$(awk -F'[:,]' '/"kind":"val"/ { for (i = 1; i < NF; i++) { if ($i == "\"step\"") s = $(i + 1); if ($i == "\"accuracy\"") a = $(i + 1) }
                                        if (!n || a > best) { best = a; step = s; n = 1 } } END { print step }' "$tmp/val3/metrics.jsonl")
    got=$("$bin" info "$tmp/val3/best.safetensors" 2>/dev/null | sed -nE 's/^training state: \{"step":([0-9]+),.*/\1/p')
    [ -n "$want" ] && [ "$got" = "$want" ] && [ -s "$tmp/val3/checkpoint.safetensors" ] \
        && ok "best.safetensors holds the step of the best validation accuracy ($want), beside the last checkpoint" \
        || bad "best.safetensors holds the step of the best validation accuracy, beside the last checkpoint" "best at $want, file at $got"
    # Ctrl-C: a checkpoint at the end of the current step, how to resume, exit 130
    "$bin" train --per-class 600 --epochs 100 --batch 16 --arch dense:32,moe:16 --experts 4 --log-every 5 --out "$tmp/int" \
        --threads 1 >"$tmp/int.out" 2>"$tmp/int.err" &
    pid=$!
    for i in $(seq 150); do grep -q '^step ' "$tmp/int.err" 2>/dev/null && break; sleep 0.2; done
    kill -INT $pid; wait $pid; rc=$?
    n=$(sed -nE 's/^specmoe: interrupted at step ([0-9]+); resume with: specmoe train --resume .*int\/checkpoint.safetensors$/\1/p' "$tmp/int.err")
    got=$("$bin" info "$tmp/int/checkpoint.safetensors" 2>/dev/null | sed -nE 's/^training state: \{"step":([0-9]+),.*/\1/p')
    [ $rc -eq 130 ] && [ -n "$n" ] && [ "$got" = "$n" ] && ! grep -q "final test accuracy" "$tmp/int.out" \
        && ok "SIGINT saves a checkpoint of the current step ($n), says how to resume and exits 130" \
        || bad "SIGINT saves a checkpoint of the current step, says how to resume and exits 130" "exit $rc, step '$n', file '$got': $(tail -n 2 "$tmp/int.err")"
    # SR-MoE: a short model with spectral penalties, analyze, and a miniature one-shot benchmark
    expect 0 "srmoe trains with spectral penalties" "final test accuracy" -- "$bin" train --model srmoe --per-class 30 \
        --epochs 1 --spectral-alpha 0.01 --diversity-beta 0.1 --out "$tmp/sr" --threads 1
    expect 0 "analyze prints spectral norm, stable rank, effective rank" "router.prototypes +4 x 64" -- \
        "$bin" analyze "$tmp/sr/checkpoint.safetensors"
    out=$("$bin" bench oneshot --seeds 1 --epochs 1 --novel 1 --phases 30 --depths 2x2 --out "$tmp/os" 2>&1); rc=$?
    if [ $rc -eq 0 ] && [ -s "$tmp/os/oneshot.json" ] && [ -s "$tmp/os/oneshot_paths.png" ] && [ -s "$tmp/os/oneshot_gradnorm.png" ] \
        && echo "$out" | grep -q "Mean Δ (surgical)"; then
        ok "bench oneshot writes tables, JSON and both plots"
    else
        bad "bench oneshot writes tables, JSON and both plots" "exit $rc: $(echo "$out" | tail -n 3)"
    fi
    expect 2 "bench oneshot: more novel images than a class has refused" "" -- "$bin" bench oneshot --novel 7000
    # GrMoE: train briefly, then evaluate at other alphas without retraining
    g="$tmp/grm"
    if "$bin" train --router grassmann --kr 8 --per-class 100 --epochs 1 --arch dense:32,moe:16 --warmup 0 \
         --out "$g" --threads 1 >/dev/null 2>&1; then
        a1=$("$bin" eval "$g/checkpoint.safetensors" --alpha 0 --threads 1 2>&1 | grep "routing entropy" | sed -nE 's/.*entropy ([0-9.]+) nats.*/\1/p')
        a2=$("$bin" eval "$g/checkpoint.safetensors" --alpha 10 --threads 1 2>&1 | grep "routing entropy" | sed -nE 's/.*entropy ([0-9.]+) nats.*/\1/p')
        awk -v a="${a1:-0}" -v b="${a2:-9}" 'BEGIN { exit !(a > 2.07 && b < a) }' \
            && ok "eval --alpha changes the sparsity without retraining (entropy $a1 at 0, $a2 at 10)" \
            || bad "eval --alpha changes the sparsity without retraining" "entropy $a1 at 0, $a2 at 10"
        expect 2 "eval refuses a checkpoint whose router does not match --router" "not 'topk'" -- \
            "$bin" eval "$g/checkpoint.safetensors" --router topk
        expect 2 "eval --alpha on a non-grassmann checkpoint refused" "applies to grassmann" -- \
            "$bin" eval "$run/checkpoint.safetensors" --alpha 2
    else
        bad "short GrMoE training run"
    fi
    if /usr/bin/python3 -c "import torch" 2>/dev/null && [ -f "$root/tools/safetensors_torch.py" ]; then
        # specmoe -> PyTorch -> specmoe: the file PyTorch writes must evaluate identically
        if /usr/bin/python3 "$root/tools/safetensors_torch.py" roundtrip "$run/checkpoint.safetensors" "$tmp/torch.safetensors" >/dev/null 2>&1; then
            out2=$("$bin" eval "$tmp/torch.safetensors" --threads 1 2>&1)
            echo "$out2" | grep -q "test accuracy: $acc" && ok "PyTorch-written checkpoint evaluates identically" \
                || bad "PyTorch-written checkpoint evaluates identically" "$(echo "$out2" | tail -n 2)"
        else
            bad "PyTorch loads and rewrites a specmoe checkpoint"
        fi
        if /usr/bin/python3 "$root/tools/safetensors_torch.py" convert "$run/checkpoint.safetensors" "$tmp/bf16.safetensors" --dtype bf16 >/dev/null 2>&1; then
            expect 0 "BF16 checkpoint from PyTorch is read" "BF16" -- "$bin" info "$tmp/bf16.safetensors"
            acc16=$("$bin" eval "$tmp/bf16.safetensors" --threads 1 2>&1 | sed -nE 's/^test accuracy: ([0-9.]+).*/\1/p')
            [ -n "$acc16" ] && awk -v a="$acc" -v b="$acc16" 'BEGIN { d = a - b; exit !(d < 0.02 && d > -0.02) }' \
                && ok "BF16 checkpoint evaluates within 0.02 of F32 ($acc16 vs $acc)" \
                || bad "BF16 checkpoint evaluates within 0.02 of F32" "$acc16 vs $acc"
        else
            bad "PyTorch converts a checkpoint to BF16"
        fi
    else
        echo "skip PyTorch interoperability (no /usr/bin/python3 with torch)"
    fi
else
    echo "skip Fashion-MNIST runs (dataset-fashion-mnist not installed)"
fi

# Hugging Face MoE checkpoints: generated by build/tests/hf_gen (tests/hf_fixture.h)
gen=${SPECMOE_HF_GEN:-$(dirname "$bin")/tests/hf_gen}
# st1 PATH NAME DTYPE T D WORD: a safetensors file of one (T, D) tensor of 4-byte elements, each the
# printf escape WORD (little-endian bytes), for calibration files no generator writes
st1() {
    local hdr="{\"$2\":{\"dtype\":\"$3\",\"shape\":[$4,$5],\"data_offsets\":[0,$(($4 * $5 * 4))]}}" i
    { printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((${#hdr} & 255)) $((${#hdr} >> 8)))"
      printf '%s' "$hdr"; for ((i = 0; i < $4 * $5; i++)); do printf "$6"; done; } > "$1"
}
if [ -x "$gen" ]; then
    hf=$tmp/hf-mixtral
    "$gen" "$hf" mixtral split 32 48 8 2 3 2 1 "$tmp/hf-calib.safetensors" 64
    expect 0 "ssmoe build --help" "--ev-c"                          -- "$bin" ssmoe build --help
    expect 0 "ssmoe prune --hf --help" "--calib"                     -- "$bin" ssmoe prune --hf x --help
    expect 0 "ssmoe build --hf (Mixtral, BF16, 2 shards) writes the EV router and report" \
        "peak memory .* MiB; one layer.s expert weights" -- "$bin" ssmoe build --hf "$hf" --calib "$tmp/hf-calib.safetensors" --threads 2
    grep -q '"router_corr"' "$hf/ev_router.json" && grep -q '"overlap"' "$hf/ev_router.json" \
        && ok "ev_router.json holds per-layer collapse statistics" || bad "ev_router.json holds per-layer collapse statistics"
    expect 0 "ssmoe prune --hf --rank ssmoe keeps 6 of 8 experts" "6 of 8 experts in each of 3 MoE layers" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$tmp/hf-pruned" --rank ssmoe --calib "$tmp/hf-calib.safetensors"
    k1=$(grep -o '"kept":[^]]*' "$tmp/hf-pruned/specmoe_prune.json" | tr -d ' \t\n')
    "$bin" ssmoe prune --hf "$hf" --out "$tmp/hf-pruned-cached" --rank ssmoe --calib "$tmp/hf-calib.safetensors" \
        --ev "$hf/ev_router.safetensors" >/dev/null 2>&1
    k2=$(grep -o '"kept":[^]]*' "$tmp/hf-pruned-cached/specmoe_prune.json" 2>/dev/null | tr -d ' \t\n')
    [ -n "$k1" ] && [ "$k1" = "$k2" ] && ok "ssmoe prune --ev (cached descriptors) keeps the same experts" \
        || bad "ssmoe prune --ev (cached descriptors) keeps the same experts" "$k1 vs $k2"
    expect 1 "ssmoe prune --ev refuses a cache built with another c" "built with ev_c 50" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$tmp/x" --calib "$tmp/hf-calib.safetensors" --ev "$hf/ev_router.safetensors" --ev-c 5
    expect 0 "the pruned directory opens again" "6 experts" -- "$bin" ssmoe build --hf "$tmp/hf-pruned" --out "$tmp/ev2.safetensors"
    expect 0 "ssmoe prune --hf --rank random needs no calibration" "4 of 8 experts" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$tmp/hf-rand" --rank random --keep 0.5 --seed 3
    expect 2 "ssmoe prune --hf --rank router without --calib refused" "needs --calib" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$tmp/x" --rank router
    # the output directory: new or empty, outside the model directory; refused as a usage error
    # before any scoring (an earlier run's files would stay beside the new ones)
    expect 2 "ssmoe prune --hf into the source directory refused" "is the model directory .* itself" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$hf" --rank random
    expect 2 "ssmoe prune --hf into a directory inside the source refused" "inside the model directory" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$hf/pruned" --rank random
    [ ! -e "$hf/pruned" ] && ok "ssmoe prune --hf: nothing created inside the source" || bad "ssmoe prune --hf: nothing created inside the source"
    expect 2 "ssmoe prune --hf into a non-empty directory refused" \
        "hf-rand: the output directory is not empty .*choose another --out or remove it" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$tmp/hf-rand" --rank router --calib "$tmp/hf-calib.safetensors"
    grep -q '"rank":.*"random"' "$tmp/hf-rand/specmoe_prune.json" && ok "ssmoe prune --hf: the refused directory is untouched" \
        || bad "ssmoe prune --hf: the refused directory is untouched"
    "$gen" "$tmp/hf-small" mixtral split 16 8 4 2 3 1 0 "$tmp/hf-calib-bad.safetensors" 8
    expect 1 "ssmoe build: calibration of the wrong width refused" "must be \(T, 32\)" -- \
        "$bin" ssmoe build --hf "$tmp/hf-pruned" --calib "$tmp/hf-calib-bad.safetensors" --out "$tmp/ev3.safetensors"
    st1 "$tmp/calib-i32.safetensors" hidden_states I32 4 32 '\x01\x00\x00\x00'
    expect 1 "ssmoe build: an I32 calibration tensor is refused naming the file and the tensor" \
        "calib-i32.safetensors: tensor 'hidden_states' is I32" -- \
        "$bin" ssmoe build --hf "$hf" --calib "$tmp/calib-i32.safetensors" --out "$tmp/ev-i32.safetensors"
    # calibration values that are not finite, or so large that the router logits overflow float (which
    # used to print -nan scores, keep experts 0..5 and write null into specmoe_prune.json), are refused
    st1 "$tmp/calib-huge.safetensors" hidden_states F32 4 32 '\xe6\xb1\x61\x7f'
    st1 "$tmp/calib-nan.safetensors" hidden_states F32 4 32 '\x00\x00\xc0\x7f'
    expect 1 "ssmoe prune --hf: huge calibration values are refused naming the file and the tensor" \
        "calib-huge.safetensors: tensor 'hidden_states' holds 3e\+38 at row 0, column 0" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$tmp/hf-huge" --rank router --calib "$tmp/calib-huge.safetensors"
    [ ! -e "$tmp/hf-huge/specmoe_prune.json" ] && ok "ssmoe prune --hf: no report after refused calibration" \
        || bad "ssmoe prune --hf: no report after refused calibration" "$(grep -m1 null "$tmp/hf-huge/specmoe_prune.json")"
    expect 1 "ssmoe build --hf: huge calibration values are refused naming the file and the tensor" \
        "calib-huge.safetensors: tensor 'hidden_states' holds 3e\+38" -- \
        "$bin" ssmoe build --hf "$hf" --calib "$tmp/calib-huge.safetensors" --out "$tmp/ev-huge.safetensors"
    expect 1 "ssmoe prune --hf: NaN calibration values are refused naming the file and the tensor" \
        "calib-nan.safetensors: tensor 'hidden_states' holds a non-finite value \(nan\) at row 0, column 0" -- \
        "$bin" ssmoe prune --hf "$hf" --out "$tmp/hf-nan" --rank ssmoe --calib "$tmp/calib-nan.safetensors"
    # a config.json declaring fewer layers than the checkpoint holds: pruning used to copy the extra
    # layer with all 8 experts beside a config that says 6
    cp -r "$hf" "$tmp/hf-fewer" && sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 2/' "$tmp/hf-fewer/config.json"
    expect 1 "ssmoe prune --hf: a layer beyond num_hidden_layers is refused, naming its tensor and file" \
        "hf-fewer/model-00001-of-00002.safetensors: tensor 'model\.layers\.2\.[^']*' belongs to layer 2, but config.json has num_hidden_layers 2" -- \
        "$bin" ssmoe prune --hf "$tmp/hf-fewer" --out "$tmp/hf-fewer-pruned" --rank random
    # the other files: a symlink is followed only inside the model directory (tokenizer.json ->
    # /etc/shadow used to be copied, world-readable), and copies keep their modes
    sl=$tmp/hf-symlink
    "$gen" "$sl" olmoe split 16 8 4 2 2 1 0
    printf 'root:secret\n' > "$tmp/secret" && chmod 600 "$tmp/secret"
    rm "$sl/tokenizer.json" && ln -s "$tmp/secret" "$sl/tokenizer.json"
    expect 1 "ssmoe prune --hf: a symlink out of the model directory is refused, naming it and its target" \
        "hf-symlink/tokenizer.json: a symbolic link to '$tmp/secret' .*outside the model directory" -- \
        "$bin" ssmoe prune --hf "$sl" --out "$tmp/hf-symlink-pruned" --rank random
    [ ! -e "$tmp/hf-symlink-pruned" ] && ok "ssmoe prune --hf: nothing written after the refused symlink" \
        || bad "ssmoe prune --hf: nothing written after the refused symlink" "$(ls -l "$tmp/hf-symlink-pruned")"
    rm "$sl/tokenizer.json" && printf '{}\n' > "$sl/tokenizer.json" && chmod 600 "$sl/tokenizer.json"
    printf '{}\n' > "$sl/generation_config.json" && chmod 664 "$sl/generation_config.json"
    ln -s generation_config.json "$sl/alias.json"
    "$bin" ssmoe prune --hf "$sl" --out "$tmp/hf-symlink-pruned" --rank random >/dev/null 2>&1
    modes=$(cd "$tmp/hf-symlink-pruned" 2>/dev/null && stat -c '%n=%a' tokenizer.json generation_config.json alias.json | tr '\n' ' ')
    [ "$modes" = "tokenizer.json=600 generation_config.json=664 alias.json=664 " ] && [ ! -L "$tmp/hf-symlink-pruned/alias.json" ] \
        && ok "ssmoe prune --hf: copies keep their modes; a link inside is copied as its file" \
        || bad "ssmoe prune --hf: copies keep their modes; a link inside is copied as its file" "$modes"
    # subdirectories (original/, onnx/) are copied recursively under the same rules; they used to be
    # skipped without a word
    mkdir -p "$sl/original" "$sl/onnx" && printf '{"dim": 16}\n' > "$sl/original/params.json" && chmod 640 "$sl/original/params.json"
    printf 'onnx\n' > "$sl/onnx/model.onnx" && chmod 750 "$sl/onnx"
    "$bin" ssmoe prune --hf "$sl" --out "$tmp/hf-subdirs" --rank random >/dev/null 2>&1
    modes=$(cd "$tmp/hf-subdirs" 2>/dev/null && stat -c '%n=%a' original/params.json onnx onnx/model.onnx | tr '\n' ' ')
    [ "$modes" = "original/params.json=640 onnx=750 onnx/model.onnx=644 " ] && cmp -s "$sl/original/params.json" "$tmp/hf-subdirs/original/params.json" \
        && ok "ssmoe prune --hf copies subdirectories with their modes" || bad "ssmoe prune --hf copies subdirectories with their modes" "$modes"
    ln -s "$tmp/secret" "$sl/onnx/leak"
    expect 1 "ssmoe prune --hf: a symlink out of a subdirectory is refused" "hf-symlink/onnx/leak: a symbolic link to .*outside" -- \
        "$bin" ssmoe prune --hf "$sl" --out "$tmp/hf-subdirs2" --rank random
    q=$tmp/hf-qwen
    "$gen" "$q" qwen2_moe fused 24 12 6 2 3 1 0 "$tmp/q-calib.safetensors" 32
    expect 0 "ssmoe prune --hf on fused Qwen2-MoE with a shared expert" "3 of 6 experts in each of 2 MoE layers" -- \
        "$bin" ssmoe prune --hf "$q" --out "$tmp/q-pruned" --rank router --keep 0.5 --calib "$tmp/q-calib.safetensors"
    b=$tmp/hf-broken
    "$gen" "$b" olmoe split 16 8 4 2 2 2 0
    rm "$b/model-00002-of-00002.safetensors"
    expect 1 "an index pointing to a missing shard is refused, naming it" "model-00002-of-00002.safetensors" -- \
        "$bin" ssmoe build --hf "$b"
    fifo=$tmp/hf-fifo
    "$gen" "$fifo" olmoe split 16 8 4 2 2 1 0
    rm "$fifo/model.safetensors" && mkfifo "$fifo/model.safetensors"
    expect 1 "a FIFO in place of a shard is refused, not waited on" "model.safetensors: not a regular file" -- \
        timeout 20 "$bin" ssmoe build --hf "$fifo"
    if /usr/bin/python3 -c "import torch" 2>/dev/null; then
        expect 0 "PyTorch loads the pruned Mixtral and the EV router beside it (tools/hf_check.py)" "ok: .*6 experts.*finite" -- \
            /usr/bin/python3 "$root/tools/hf_check.py" "$tmp/hf-pruned" --ev "$tmp/ev2.safetensors"
        expect 0 "PyTorch loads the pruned Qwen2-MoE (tools/hf_check.py)" "ok: .*2 MoE layers of 3 experts" -- \
            /usr/bin/python3 "$root/tools/hf_check.py" "$tmp/q-pruned"
    else
        echo "skip PyTorch loading of pruned models (no /usr/bin/python3 with torch)"
    fi
else
    bad "Hugging Face fixture generator $gen is missing"
fi
# bench tokenize (experiments/softmoe_rl/tokenize.c): the plan of each tier, refusals, and a tiny
# study end to end (three DER runs of Fig. 5 on Breakout, then the report of the figure)
expect 0 "bench tokenize: the quick tier is Figs. 1 and 5, 13 variants x 2 games" "^bench-tokenize tier=quick .* runs=26 jobs=2 " -- \
    "$bin" bench tokenize --dry-run --out "$tmp/tk-plan"
expect 0 "bench tokenize: the full tier is every figure on five games, 3 seeds, on Rainbow-lite" "^bench-tokenize tier=full .*seeds=3 frames=1000000 der_frames=250000 agent=rainbow .* runs=675 " -- \
    "$bin" bench tokenize --tier full --dry-run --out "$tmp/tk-plan"
expect 0 "bench tokenize: the routing-sharpness ablation runs SoftMoE-4 and SoftMoE-1 x4 at temperature 0.1" "softmoe-4-t0.1/breakout-s1 .*--router soft --experts 4 --temperature 0.1 .*softmoe-1-x4-t0.1/breakout-s1 .*--router soft --experts 1 --temperature 0.1" -- \
    sh -c '"$0" bench tokenize --tier full --figures sharp --games breakout --seeds 1 --dry-run --out "$1" | tr "\n" " "' "$bin" "$tmp/tk-plan"
expect 0 "bench tokenize: Fig. 11 runs its resets under DER and Rainbow-lite, as the paper" "--agent der .*softmoe-4-reset/breakout-s1 .*--agent rainbow .*softmoe-4-reset/breakout-s1 " -- \
    sh -c '"$0" bench tokenize --tier full --figures 11 --games breakout --seeds 1 --dry-run --out "$1" | tr "\n" " "' "$bin" "$tmp/tk-plan"
expect 0 "bench tokenize: DQN and Rainbow-lite run the paper's Table 1 (--preset dopamine), DER its own" \
    "--agent rainbow --preset dopamine .*--agent dqn --preset dopamine .*--agent der --sticky 0 --frames " -- \
    sh -c '"$0" bench tokenize --tier full --figures 10,1 --games breakout --seeds 1 --dry-run --out "$1" | tr "\n" " "' "$bin" "$tmp/tk-plan"
expect 0 "bench tokenize: the full tier's DER runs a quarter of the frames (the paper: 50M against 200M), resets at the paper's share of a run" \
    "--agent der --sticky 0 --frames 250000 .*--ckpt-every 25000 --reset-every 1001 .*--agent rainbow --preset dopamine --frames 1000000 .*--ckpt-every 100000 --reset-every 100001 " -- \
    sh -c '"$0" bench tokenize --tier full --figures 11 --games breakout --seeds 1 --dry-run --out "$1" | grep softmoe-4-reset | tr "\n" " "' "$bin" "$tmp/tk-plan"
expect 0 "bench tokenize: Fig. 5's tokenised baselines pool after the per-token dense layer (not before it: that is gap)" \
    "--arch conv:16:3:1:0,tokens,dense:128,toksum .*--arch conv:16:3:1:0,tokens,dense:128,tokmean" -- \
    sh -c '"$0" bench tokenize --tier full --figures 5 --games breakout --seeds 1 --dry-run --out "$1" | tr "\n" " "' "$bin" "$tmp/tk-plan"
expect 0 "bench tokenize: Fig. 12's token choice keeps the raw top-1 weight (a renormalised one has no gradient) and capacity 1" \
    "token-choice-4/breakout-s1 .*--router topk --experts 4 --topk 1 --renorm 0 --capacity 1" -- \
    "$bin" bench tokenize --tier full --figures 12 --games breakout --seeds 1 --dry-run --out "$tmp/tk-plan"
expect 2 "bench tokenize: a DER main agent that would not learn within --der-frames is refused" "--agent der learns after 1600 frames; --der-frames 1000 ends" -- \
    "$bin" bench tokenize --der-frames 1000 --dry-run --out "$tmp/tk-plan"
expect 0 "bench tokenize: the quick tier's Fig. 11 leaves out Rainbow-lite, which would not learn in 10k frames" \
    "^bench-tokenize note: Fig. 11 leaves out rainbow" -- "$bin" bench tokenize --figures 11 --dry-run --out "$tmp/tk-plan"
expect 2 "bench tokenize: a main agent that would not learn within --frames is refused" "--agent rainbow learns after 20000 frames" -- \
    "$bin" bench tokenize --agent rainbow --dry-run --out "$tmp/tk-plan"
expect 0 "rl train --preset dopamine: the paper's Table 1 on Rainbow-lite (update every 4, no double Q, C51 kept)" \
    "^rl-train env=minatar/breakout agent=rainbow frames=20100 updates=26 " -- sh -c '"$0" rl train --env minatar/breakout --agent rainbow \
    --preset dopamine --frames 20100 --out "$1" && grep -q "\"double_q\":\s*0," "$1/settings.json" && grep -q "\"atoms\":\s*51," "$1/settings.json" &&
    grep -q "\"lr\":\s*6.25e-05," "$1/settings.json"' "$bin" "$tmp/rl_dopamine"
expect 0 "rl train --resume: settings.json keeps the run's --sticky 0 (the checkpoint carries it)" "^rl-train env=minatar/breakout agent=dqn frames=1200 " -- \
    sh -c '"$0" rl train --env minatar/breakout --agent dqn --sticky 0 --frames 1200 --learning-starts 100 --stop-after 600 --out "$1" >/dev/null 2>&1 &&
    "$0" rl train --resume "$1/checkpoint.safetensors" && grep -q "\"sticky\":\s*0," "$1/settings.json"' "$bin" "$tmp/rl_sticky"
# a checkpoint written before an option existed (here per_beta_end, taken out of its settings) resumes
# with the option's default, which is the old behaviour
# a run killed after its checkpoint had logged more records; its resumption drops them (and a line
# cut off mid-write), so no episode is counted twice: global_step never goes back
expect 0 "rl train --resume: records logged after the checkpoint by the stopped run are dropped, the earlier ones kept" "^ok\$" -- sh -c '
    "$0" rl train --env minatar/breakout --agent dqn --frames 1200 --learning-starts 100 --stop-after 600 --out "$1" >/dev/null 2>&1 &&
    kept=$(grep -c "" "$1/metrics.jsonl") && [ "$kept" -gt 0 ] &&
    printf "{\"global_step\": 900, \"episodic_return\": 77}\n{\"global_step\": 9" >> "$1/metrics.jsonl" &&
    "$0" rl train --resume "$1/checkpoint.safetensors" >/dev/null 2>&1 && ! grep -q "\"episodic_return\": 77" "$1/metrics.jsonl" &&
    [ "$(head -n "$kept" "$1/metrics.jsonl" | grep -c "")" -eq "$kept" ] && [ "$(grep -c "" "$1/metrics.jsonl")" -gt "$kept" ] &&
    [ "$(sed -n "s/^{\"global_step\": \([0-9]*\).*/\1/p" "$1/metrics.jsonl" | awk "\$1 <= 600" | grep -c "")" -eq "$kept" ] &&
    sed -n "s/^{\"global_step\": \([0-9]*\).*/\1/p" "$1/metrics.jsonl" | awk "\$1 < p { bad = 1 } { p = \$1 } END { print bad ? \"back\" : \"ok\" }"' "$bin" "$tmp/rl_killed"
expect 0 "rl train --resume: a checkpoint older than an option resumes with its default" "^rl-train env=minatar/breakout agent=rainbow frames=1200 " -- \
    sh -c '"$0" rl train --env minatar/breakout --agent rainbow --frames 1200 --learning-starts 100 --stop-after 600 --out "$1" >/dev/null 2>&1 &&
    /usr/bin/python3 -c "import json,struct,sys; p=sys.argv[1]; b=open(p,\"rb\").read(); n=struct.unpack(\"<Q\",b[:8])[0]; h=json.loads(b[8:8+n]);
s=json.loads(h[\"__metadata__\"][\"agent_settings\"]); del s[\"per_beta_end\"]; h[\"__metadata__\"][\"agent_settings\"]=json.dumps(s);
t=json.dumps(h).encode(); t+=b\" \"*((8-len(t)%8)%8); open(p,\"wb\").write(struct.pack(\"<Q\",len(t))+t+b[8+n:])" "$1/checkpoint.safetensors" &&
    "$0" rl train --resume "$1/checkpoint.safetensors"' "$bin" "$tmp/rl_old_option"
expect 0 "bench tokenize --encoder impala puts residual blocks in front" "--arch conv:16:3:1:1,maxpool:2:2,res:16,res:16,.*,act,dense:128\$" -- \
    "$bin" bench tokenize --encoder impala --figures 5 --games breakout --dry-run --out "$tmp/tk-plan"
expect 2 "bench tokenize: an unknown figure is named with the valid ones" "unknown figure '9' \(1, 7, 5" -- "$bin" bench tokenize --figures 1,9
expect 2 "bench tokenize: an unknown game is refused" "unknown game 'pong'" -- "$bin" bench tokenize --games pong
expect 2 "bench tokenize: an unknown encoder is refused" "--encoder must be minatar, nature or impala" -- "$bin" bench tokenize --encoder vit
expect 0 "bench tokenize: a tiny Fig. 5 study runs and reports its ten variants, named" "^\| tok-mean \| 1 x 1 " -- \
    "$bin" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$tmp/tk"
expect 0 "bench tokenize: the reports normalise by the agent's best finished run under --out" \
    "minatar/breakout: random [0-9.]+ \(1000 episodes\), reference [0-9.]+ \(the best run of --reference-runs\)" -- \
    sh -c '"$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$1" && [ "$(wc -l < "$1/der-minatar/reference-runs.txt")" -eq 10 ]' "$bin" "$tmp/tk"
expect 0 "bench tokenize: a finished study is not run again" "status=done-before" -- \
    "$bin" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$tmp/tk"
expect 0 "bench tokenize --report-only: the reports of the finished runs, none run" "^reported, nothing run\$" -- sh -c '
    out=$("$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$1" --report-only 1) &&
    echo "$out" | grep -q "^bench-tokenize report-only: 10 of the 10 planned runs finished" && echo "$out" | grep -q "^| tok-mean | 1 x 1 " &&
    ! echo "$out" | grep -q "^bench-tokenize-run" && echo "reported, nothing run"' "$bin" "$tmp/tk"
expect 0 "bench tokenize: a figure tests its paper claims; one seed a game decides none" \
    "^\| tok-mean-x4 > baseline-x4 \| 1 x 1 \| .* \| not decidable \(1 run per game; 3 needed\) \|\$" -- \
    "$bin" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$tmp/tk" --report-only 1
expect 0 "bench tokenize: the sharpness ablation tests its own claims (sharpening helps; Fig. 1's claims sharpened)" \
    "^\| softmoe-4-t0.1 > softmoe-4 \| 1 x 1 \| .*\| softmoe-1-x4-t0.1 > softmoe-1-x4 \| .*\| softmoe-4-t0.1 > baseline \| .*\| softmoe-1-x4-t0.1 ~ softmoe-4-t0.1 \| 1 x 1 \| .* \| not decidable \(1 run per game; 3 needed\) \|\$" -- \
    sh -c 'out=$("$0" bench tokenize --figures sharp --games breakout --frames 1800 --reps 100 --out "$1") &&
        echo "$out" | grep "^| softmoe.* [>~] " | tr "\n" " " | sed "s/ \$//"' "$bin" "$tmp/tk-sharp"
expect 0 "bench tokenize --report-only: an agent with no run yet needs no reference pool" "^exit 0, no complaint\$" -- sh -c '
    out=$("$0" bench tokenize --figures 5,10 --games breakout --frames 30000 --der-frames 1800 --reps 100 --out "$1" --report-only 1 2>&1) &&
    ! echo "$out" | grep -q "cannot write" && [ ! -e "$1/dqn-minatar" ] && echo "exit 0, no complaint"' "$bin" "$tmp/tk"
# a figure's table compares its variants on the same games and seeds: a (game, seed) with a run not
# finished is left out, named, and with none complete there is no table
expect 0 "bench tokenize: a figure reports only the games and seeds whose every variant finished" \
    "^bench-tokenize-figure fig=5 agent=der: 0 of 1 games x seeds complete; left out, not complete: breakout-s1 \(9 of 10 runs\) no-table\$" -- sh -c '
    rm -rf "$1-partial" && cp -r "$1" "$1-partial" && rm "$1-partial/der-minatar/tok-sum/breakout-s1/done" &&
    out=$("$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$1-partial" --report-only 1) &&
    echo "$out" | grep "games x seeds complete" | tr "\n" " " && { echo "$out" | grep -q "^| " && echo table || echo no-table; }' "$bin" "$tmp/tk"
expect 0 "bench tokenize --variants: runs those variants only; the figure waits for the rest" \
    "^ran 2, bench-tokenize runs=2; bench-tokenize-figure fig=5 agent=der: 0 of 1 games x seeds complete; left out, not complete: breakout-s1 \(2 of 10 runs\)\$" -- sh -c '
    rm -rf "$1" && out=$("$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --variants baseline,tok-sum --out "$1") &&
    printf "ran %s, %s; " "$(echo "$out" | grep -c "status=ok")" "$(echo "$out" | grep -o "^bench-tokenize runs=[0-9]*")" &&
    echo "$out" | grep "games x seeds complete"' "$bin" "$tmp/tk-variants"
# two benches on one --out (the full tier's two queues): a run another process holds (DIR/lock, here
# this shell's flock on fd 9) is skipped as busy, not run twice at once; once free, it runs
expect 0 "bench tokenize: a run another process holds is skipped as busy, and runs once free" \
    "^busy 1, ran 0, untouched; then ran 1\$" -- sh -c '
    d="$1/der-minatar/tok-mean/breakout-s1" && mkdir -p "$d" && exec 9>"$d/lock" && flock -n 9 &&
    out=$("$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --variants baseline,tok-sum,tok-mean --out "$1") &&
    printf "busy %s, ran %s, " "$(echo "$out" | grep -c "variant=tok-mean .*status=busy")" "$(echo "$out" | grep -c "status=ok")" &&
    { [ -e "$d/metrics.jsonl" ] || [ -e "$d/command" ] || echo "untouched; "; } | tr -d "\n" && exec 9>&- &&
    out=$("$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --variants baseline,tok-sum,tok-mean --out "$1") &&
    echo "then ran $(echo "$out" | grep -c "variant=tok-mean .*status=ok")"' "$bin" "$tmp/tk-variants"
expect 2 "bench tokenize --variants: a variant of no selected figure is refused" "variant 'softmoe-4' is in none of the selected figures" -- \
    "$bin" bench tokenize --figures 5 --variants softmoe-4 --dry-run
# tools/softmoe_rl/runs_archive.sh keeps a finished run's score: saved and restored elsewhere, the
# study reports the same table
expect 0 "runs_archive.sh: restored runs report as the originals" "^same\$" -- sh -c '
    rm -rf "$1-arch" "$1-restored" && "$2/tools/softmoe_rl/runs_archive.sh" save "$1" "$1-arch" >/dev/null &&
    "$2/tools/softmoe_rl/runs_archive.sh" restore "$1-restored" "$1-arch" >/dev/null &&
    a=$("$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$1" --report-only 1 | grep "^|") &&
    b=$("$0" bench tokenize --figures 5 --games breakout --frames 1800 --reps 100 --out "$1-restored" --report-only 1 | grep "^|") &&
    [ -n "$a" ] && [ "$a" = "$b" ] && [ ! -e "$1-arch/der-minatar/tok-sum/breakout-s1/checkpoint.safetensors" ] && echo same' "$bin" "$tmp/tk" "$root"
expect 0 "runs_archive.sh: a restored run keeps its learning curve; plot --labels dir names curves by variant" \
    "^plot-curve label=baseline runs=1 plot-curve label=tok-sum runs=1 plot: 2 runs in 2 groups" -- sh -c '
    "$0" plot "$1-restored/der-minatar/baseline/breakout-s1" "$1-restored/der-minatar/tok-sum/breakout-s1" --x global_step \
        --y curve_return --labels dir --out "$1-curves.png" | tr "\n" " " && [ -s "$1-curves.png" ]' "$bin" "$tmp/tk"
# tools/softmoe_rl/tier_left.sh prices what is left of the full tier: a finished run is not left, and a
# run two figures share (softmoe-4: Figs. 15 and 12) is counted under the first figure only
expect 0 "tier_left.sh: the runs left per figure, priced, a shared run counted once" \
    "^15 75 1 74 7.9 12 45 0 30 4.2 tier-left runs=104 cpu_hours=12.1" -- sh -c '
    rm -rf "$1" && mkdir -p "$1/rainbow-minatar/gap/breakout-s1" && touch "$1/rainbow-minatar/gap/breakout-s1/done" &&
    "$2/tools/softmoe_rl/tier_left.sh" "$0" "$2/docs/results/tokenize_full_tier_cost_4aefb9a.txt" "$1" 15,12 |
        sed 1d | tr -s " \n" " "' "$bin" "$tmp/tier-left" "$root"
expect 2 "tier_left.sh: a runs directory that is not there is named" "/nonexistent-runs is not a directory" -- \
    "$root/tools/softmoe_rl/tier_left.sh" "$bin" "$root/docs/results/tokenize_full_tier_cost_4aefb9a.txt" /nonexistent-runs
# tools/softmoe_rl/tier_start.sh: each session's queues; the runs that decide a claim come first (the first
# part is Fig. 7 without PerPatch, which no claim names), and every part is a valid plan (--print checks them)
expect 0 "tier_start.sh --print: claim-deciding runs first, the figures completed after" \
    "^7:softmoe-1,softmoe-1-perfeat,softmoe-1-shuffled,softmoe-1-x4,softmoe-1-x4-perfeat,softmoe-1-x4-shuffled 10:all 11:softmoe-4,softmoe-4-reset,softmoe-4-sp 5:baseline-x4,tok-sum-x4,tok-mean-x4 7:all 11:all 5:all 1,sharp,15,12,8,19:all queues=2 \$" -- sh -c '
    SPECMOE="$0" "$1/tools/softmoe_rl/tier_start.sh" --print "$2" > "$2.txt" &&
    sed -n "s/^tier-start part=[0-9]* figures=\([^ ]*\) .* variants=\(.*\)/\1:\2/p" "$2.txt" | tr "\n" " " &&
    echo "queues=$(grep -c "tier_queue.sh $2/specmoe-[0-9a-z]* $2/tokenize-full [01] \"7;" "$2.txt") "' "$bin" "$root" "$tmp/tier-start"
expect 2 "tier_start.sh: a binary that is not there is named" "/nonexistent/specmoe is not built" -- \
    env SPECMOE=/nonexistent/specmoe "$root/tools/softmoe_rl/tier_start.sh" --print "$tmp/tier-start"
# tools/softmoe_rl/tier_queue.sh saves the finished runs while a part still runs (every SAVE_EVERY
# seconds), not only after it: a stand-in for the bench finishes one run, then waits (up to 10 s) for
# it to appear in the archive before it exits; the run arrives whole (its curve and scored episode)
mkdir -p "$tmp/tier-queue" && cat > "$tmp/tier-queue/bench" <<'FAKE'
#!/bin/sh
[ "$1" = --help ] && exit 0   # the archive's probe of OpenBLAS's kernels (none here: openblas-core=unknown)
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
d=$out/rainbow-minatar/softmoe-1/breakout-s1 a=$RUNS_ARCHIVE/rainbow-minatar/softmoe-1/breakout-s1
mkdir -p "$d" && echo '{}' > "$d/settings.json" && echo cmd > "$d/command" && echo log > "$d/train.log" &&
echo '{"global_step": 1000, "episodic_return": 2.5}' > "$d/metrics.jsonl" && touch "$d/done"
i=0; while [ $i -lt 100 ] && [ ! -f "$a/done" ]; do sleep 0.1; i=$((i + 1)); done
[ -f "$a/done" ] && echo "stand-in: saved while running" || echo "stand-in: not saved while running"
FAKE
chmod +x "$tmp/tier-queue/bench"
expect 0 "tier_queue.sh: a finished run is archived while its part still runs, whole" \
    "^stand-in: saved while running; 6 files; \{\"global_step\": 50000, \"curve_return\": 2.5, \"curve_episodes\": 1\} \{\"global_step\": 1000, \"episodic_return\": 2.5\} \$" -- sh -c '
    RUNS_ARCHIVE="$1/arch" SAVE_EVERY=1 "$0/tools/softmoe_rl/tier_queue.sh" "$1/bench" "$1/out" 0 "7;breakout;1" &&
    printf "%s; %s files; " "$(grep -o "^stand-in: .*" "$1/out/queue-0.log")" "$(ls "$1"/arch/*/*/* | wc -l)" &&
    cat "$1/arch/rainbow-minatar/softmoe-1/breakout-s1/metrics.jsonl" | tr "\n" " "' "$root" "$tmp/tier-queue"
# the save records the machine a run ran on (its CPU and the kernels OpenBLAS picks there set the
# order of the run's sums); the stand-in bench has no OpenBLAS, so SPECMOE names the binary to ask
expect 0 "runs_archive.sh: a saved run records its host's CPU, ISA and OpenBLAS kernels" \
    '^cpu="[^"]*" family=[0-9]+ model=[0-9]+ isa=(avx512f|avx2|baseline) openblas-core=[A-Za-z0-9]+$' -- sh -c '
    rm -rf "$1/arch-host" && SPECMOE="$0" "$2/tools/softmoe_rl/runs_archive.sh" save "$1/out" "$1/arch-host" >/dev/null &&
    cat "$1/arch-host/rainbow-minatar/softmoe-1/breakout-s1/host"' "$bin" "$tmp/tier-queue" "$root"
expect 0 "runs_archive.sh: a save stopped halfway (RUN.saving) is not restored as a run" \
    "^runs_archive: 1 finished runs restored into [^ ]* breakout-s1 \$" -- sh -c '
    mkdir -p "$1/arch/rainbow-minatar/softmoe-1/breakout-s2.saving" && touch "$1/arch/rainbow-minatar/softmoe-1/breakout-s2.saving/done" &&
    { "$0/tools/softmoe_rl/runs_archive.sh" restore "$1/restored" "$1/arch" && ls "$1/restored/rainbow-minatar/softmoe-1"; } | tr "\n" " "' \
    "$root" "$tmp/tier-queue"
# runs_archive.sh hosts counts the archived runs by the machine that made them and marks this one's
# (runs from kinds of CPU whose sums differ are other samples: a new machine's session reads this)
expect 0 "runs_archive.sh hosts: the archive's runs counted by host, this machine's marked" \
    '^this machine: (cpu=[^|]*) \| 2 runs cpu="Other" family=1 model=1 isa=avx2 openblas-core=Zen \| 1 runs \(no host file: saved before 2026-12-02\) \| 1 runs \1 \(this machine\) \|$' -- sh -c '
    a=$1/arch-hosts && rm -rf "$a" && mkdir -p "$a/rainbow-minatar/v" && cp -r "$1/arch-host/rainbow-minatar/softmoe-1/breakout-s1" "$a/rainbow-minatar/v/g-s1" &&
    for r in g-s2 g-s3 g-s4 g-s5.saving; do mkdir -p "$a/rainbow-minatar/v/$r" && touch "$a/rainbow-minatar/v/$r/done"; done &&
    for r in g-s2 g-s3 g-s5.saving; do echo "cpu=\"Other\" family=1 model=1 isa=avx2 openblas-core=Zen" > "$a/rainbow-minatar/v/$r/host"; done &&
    SPECMOE="$0" "$2/tools/softmoe_rl/runs_archive.sh" hosts "$a" | sed "s/^runs_archive: *//" | tr -s " " | tr "\n" "|" | sed "s/|/ | /g; s/ \$//"' \
    "$bin" "$tmp/tier-queue" "$root"
expect 0 "runs_archive.sh: report --curves reads a restored run's kept curve as the original's episodes" "^same 1 point\$" -- sh -c '
    a=$("$0" report "$1"/der-minatar/*/breakout-s1 --labels dir --random-episodes 20 --reps 50 --curves "$1-c.png" | grep "^| 50000 |") &&
    b=$("$0" report "$1-restored"/der-minatar/*/breakout-s1 --labels dir --random-episodes 20 --reps 50 --curves "$1-c.png" | grep "^| 50000 |") &&
    [ -n "$a" ] && [ "$a" = "$b" ] && echo "$a" | grep -qE "^\| 50000 \|( -?[0-9]+\.[0-9]+ \[[-0-9.]+, [-0-9.]+\] \|)+\$" &&
    echo "same $(echo "$a" | wc -l) point"' "$bin" "$tmp/tk"
expect 2 "plot --labels: only dir" "--labels must be dir" -- "$bin" plot "$tmp/tk" --labels variant
expect 2 "bench tokenize: a finished run of another command under the same name is refused, not reported" \
    "ran another command than this plan's" -- "$bin" bench tokenize --figures 5 --games breakout --frames 1900 --reps 100 --out "$tmp/tk"
# the PyTorch peer of the Fig. 1 networks (tools/peers/dqn_minatar.py, timed by
# tools/peers/compare_tokenize.sh) computes specmoe's function: specmoe's parameters loaded into it
# give specmoe's Q-values and gradients of the update's loss; a changed Q-value or gradient is caught
dqnu=$(dirname "$bin")/dqn_update
if [ -x "$dqnu" ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
    for pair in "softmoe-4|tokens,moe:128,flatten --router soft --experts 4" \
                "expert-choice-1-x4|tokens,moe:512,flatten --router expert-choice --experts 1" "baseline|dense:128"; do
        net=${pair%%|*}
        expect 0 "the PyTorch peer's $net gives specmoe's Q-values and gradients" "^peer-check net=$net .* ok\$" -- sh -c '
            "$0" --obs env --sample 0 --arch conv:16:3:1:0,$3 --dump "$1.st" >/dev/null && /usr/bin/python3 "$2" --check "$1.st" --net "$4"' \
            "$dqnu" "$tmp/peer-$net" "$root/tools/peers/dqn_minatar.py" "${pair#*|}" "$net"
    done
    for what in "check.q|a Q-value" "grad.layers.2.router.phi|a gradient"; do
        expect 1 "the PyTorch peer's check catches ${what#*|} that differs" "MISMATCH" -- sh -c '
            /usr/bin/python3 -c "import sys; sys.path.insert(0, sys.argv[3]); import safetensors_torch as st
t, m = st.load(sys.argv[1]); v = t[sys.argv[4]]; v.view(-1)[0] += 0.1 * v.abs().max(); st.save(t, sys.argv[2], metadata=m)" \
                "$0" "$1" "$2/tools" "$3" && /usr/bin/python3 "$2/tools/peers/dqn_minatar.py" --check "$1" --net softmoe-4' \
            "$tmp/peer-softmoe-4.st" "$tmp/peer-bad.st" "$root" "${what%%|*}"
    done
else
    echo "skip the PyTorch peer's check ($dqnu or /usr/bin/python3 with torch missing)"
fi
# tools/peers/tokenize_encoders.sh times the speed bar's two networks on each encoder of the tier's
# plan: the plan it reads names the encoder's networks (Impala's, Nature's here), and its summary
# gives each network's FLOPs and its time over the first network's, as the ratio of its own numbers
expect 0 "tokenize_common.sh: the plan's networks on the Impala encoder" \
    "^baseline --arch conv:16:3:1:1,maxpool:2:2,.*,res:32,act,dense:128 softmoe-4 --arch conv:16:3:1:1,.*,act,tokens,moe:128,flatten --router soft --experts 4\$" -- \
    bash -c 'cd "$1" && . tools/peers/tokenize_common.sh && TOKENIZE_SPECMOE=$0 tokenize_plan "" --figures 1 --encoder impala |
        grep -E "^(baseline|softmoe-4) " | tr "\n" " " | sed "s/ \$//"' "$bin" "$root"
if [ -x "$dqnu" ]; then
    expect 0 "tokenize_encoders.sh --plan: each encoder's networks, as the tier plans them" \
        "^nature baseline --arch conv:32:3:1:0,conv:64:3:1:0,conv:64:3:1:0,dense:128 nature softmoe-4 --arch conv:32:3:1:0,conv:64:3:1:0,conv:64:3:1:0,tokens,moe:128,flatten --router soft --experts 4 \$" -- \
        sh -c '"$1/tools/peers/tokenize_encoders.sh" --build "$0" --encoders nature --plan 1 | tr "\n" " "' "$(dirname "$bin")" "$root"
    expect 0 "tokenize_encoders.sh --equal: SoftMoE-4 with its experts as wide as asked (Impala)" \
        "^impala softmoe-4-eq --arch conv:16:3:1:1,.*,act,tokens,moe:240,flatten --router soft --experts 4 \$" -- \
        sh -c '"$1/tools/peers/tokenize_encoders.sh" --build "$0" --encoders impala --nets softmoe-4 --equal 240 --plan 1 | sed 1d | tr "\n" " "' \
        "$(dirname "$bin")" "$root"
    expect 1 "tokenize_encoders.sh --equal: one width per encoder" "--equal needs one width per encoder \(2\)" -- \
        "$root/tools/peers/tokenize_encoders.sh" --build "$(dirname "$bin")" --encoders minatar,impala --equal 240 --plan 1
    expect 0 "tokenize_encoders.sh: the baseline and SoftMoE-4 on MinAtar's encoder, timed, the ratio of its times" "^ok\$" -- \
        sh -c '"$1/tools/peers/tokenize_encoders.sh" --build "$0" --encoders minatar --reps 1 --seconds 0.01 | sed -n "s/^tokenize-encoder //p" |
            awk "{ for (i = 1; i <= NF; i++) { split(\$i, kv, \"=\"); v[NR, kv[1]] = kv[2] } }
                 END { want = sprintf(\"%.2f\", v[2, \"cpu_us_per_update\"] / v[1, \"cpu_us_per_update\"]);
                       ok = NR == 2 && v[1, \"net\"] == \"baseline\" && v[1, \"mflop\"] == \"40.83\" && v[1, \"over_baseline\"] == \"1.00\" &&
                            v[2, \"net\"] == \"softmoe-4\" && v[2, \"mflop\"] == \"126.09\" && v[2, \"over_baseline\"] == want &&
                            v[2, \"round_ratio_median\"] == want && v[2, \"round_ratio_min\"] == want && v[2, \"round_ratio_max\"] == want;
                       print ok ? \"ok\" : \"wrong: ratio \" v[2, \"over_baseline\"] \" want \" want }"' "$(dirname "$bin")" "$root"
    expect 0 "tokenize_encoders.sh: a network not in the plan is named before anything is timed" "^no network 'softmoe-9' in the plan.* untimed\$" -- \
        sh -c 'out=$("$1/tools/peers/tokenize_encoders.sh" --build "$0" --encoders minatar --reps 1 --nets baseline,softmoe-9 2>&1); rc=$?
            echo "$out" | grep -q "^round" && exit 3; [ $rc -eq 1 ] && echo "${out#tokenize_encoders: } untimed"' "$(dirname "$bin")" "$root"
fi
# continual RL (SPHERE Sec. 5.1): rl train --init-from, and a final policy scored on another task of its family
expect 0 "rl train --init-from: the next task starts from the previous task's checkpoint" "^rl-train env=mujoco/reach-1 agent=ppo frames=256 " -- \
    sh -c "'$bin' rl train --env mujoco/reach-0 --agent ppo --num-envs 2 --num-steps 64 --num-minibatches 2 --frames 256 --out '$tmp/crl0' >/dev/null &&
           '$bin' rl train --env mujoco/reach-1 --agent ppo --num-envs 2 --num-steps 64 --num-minibatches 2 --frames 256 --out '$tmp/crl1' \
               --init-from '$tmp/crl0/checkpoint.safetensors'"
expect 1 "rl train --init-from: a checkpoint of other settings is refused" "crl0/checkpoint.safetensors: its agent settings" -- \
    "$bin" rl train --env mujoco/reach-1 --agent ppo --num-envs 2 --num-steps 32 --num-minibatches 2 --frames 256 --out "$tmp/crl2" \
    --init-from "$tmp/crl0/checkpoint.safetensors"
# SN after --init-from: the power iterations start from the loaded (normalised) weights, whose
# sigma is 1, not from the fresh network's (about 1.5 here): the first sigma_max stays near 1
expect 0 "rl train --init-from: spectral normalisation continues from the loaded weights" "^ok\$" -- sh -c '
    A="--agent ppo --actor moe --arch dense:16,dense:16 --experts 2 --topk 1 --sn 1 --num-steps 1024"
    "$0" rl train $A --env mujoco/reach-0 --frames 8192 --out "$1/sn0" >/dev/null 2>&1 &&
    "$0" rl train $A --env mujoco/reach-1 --frames 2048 --out "$1/sn1" --init-from "$1/sn0/checkpoint.safetensors" >/dev/null 2>&1 &&
    grep -o "\"sn/sigma_max\": [0-9.]*" "$1/sn1/metrics.jsonl" | head -1 | awk "{ print (\$2 < 1.3 ? \"ok\" : \"sigma_max \" \$2) }"' "$bin" "$tmp"
expect 2 "rl train --init-from is refused with --resume" "--init-from starts a new ppo run" -- \
    "$bin" rl train --resume "$tmp/crl0/checkpoint.safetensors" --init-from "$tmp/crl0/checkpoint.safetensors"
expect 0 "rl eval: a policy scored on another task of its family" "^rl-eval env=mujoco/reach-2 .*episodes=2 " -- \
    "$bin" rl eval "$tmp/crl1/checkpoint.safetensors" --env mujoco/reach-2 --episodes 2
expect 1 "rl eval: a task of other spaces is refused" "whose spaces differ" -- \
    "$bin" rl eval "$tmp/crl1/checkpoint.safetensors" --env mujoco/cheetah-run --episodes 2
# bench sphere (experiments/sphere/): the plan of each tier, refusals, and a tiny study end to end, resumed
expect 0 "bench sphere: the quick tier is the reach family, 2 seeds, a smoke test" \
    "^bench-sphere tier=quick \(a smoke test.*families=reach seeds=2 frames_per_task=20480 runs=151 " -- \
    "$bin" bench sphere --dry-run --out "$tmp/sph-plan"
expect 0 "bench sphere: the full tier is both families, 5 seeds, 1M frames per task" \
    "^bench-sphere tier=full figures=.* families=cheetah,reach seeds=5 frames_per_task=1000000 runs=647 " -- \
    "$bin" bench sphere --tier full --dry-run --out "$tmp/sph-plan"
expect 0 "bench sphere: a CRL task starts from the previous task's checkpoint" \
    "--env mujoco/reach-1 .*--out .*/crl/topk/s1/1-reach-1 --actor moe --init-from .*/crl/topk/s1/0-reach-0/checkpoint.safetensors" -- \
    "$bin" bench sphere --dry-run --out "$tmp/sph-plan"
expect 0 "bench sphere: the reach family runs without observation and reward normalisers (MetaWorld's setting), the cheetah with them" \
    "--env mujoco/reach-0 --norm-obs 0 --norm-reward 0 --out .*--env mujoco/cheetah-run --out " -- \
    sh -c '"$0" bench sphere --tier full --figures 13 --methods topk --seeds 1 --dry-run --out "$1" | grep -E "/rl/topk/(reach-0|cheetah-run)/s1 " | sort -r | tr "\n" " "' "$bin" "$tmp/sph-plan"
expect 0 "bench sphere: SPHERE's ratio is each family's paper setting (cheetah 0.001 as HumanoidBench, reach 0.1 as MetaWorld)" \
    "cheetah-run/s1 --actor moe --sphere-rho 0.001 .*/reach-0/s1 --actor moe --sphere-rho 0.1 " -- \
    sh -c '"$0" bench sphere --tier full --figures 13 --methods sphere --seeds 1 --dry-run --out "$1" | grep "/rl/sphere/.*-run/s1 \|/rl/sphere/reach-0/s1 " | tr "\n" " "' "$bin" "$tmp/sph-plan"
expect 0 "bench sphere: Fig. 10 sweeps the cheetah's ratio; on the reach it runs HumanoidBench's 0.001 (the paper's cross-benchmark check)" \
    "^cheetah:sphere-rho=0.0001,sphere-rho=0.01, reach:sphere-rho=0.001, \$" -- \
    sh -c 'for f in cheetah reach; do printf "%s:" $f; "$0" bench sphere --figures 10 --families $f --seeds 1 --dry-run --out "$1" |
        grep -o "/crl/sphere-rho=[0-9.e-]*/s1/0-" | sed "s#/crl/##; s#/s1/0-##" | sort -u | tr "\n" ","; printf " "; done' "$bin" "$tmp/sph-plan"
expect 0 "bench sphere: the full tier runs Table 1 and Tables 4/6 on the cheetah alone, as the paper on HumanoidBench" \
    "^note cheetah-runs=30 reach-runs=0\$" -- sh -c '"$0" bench sphere --tier full --figures 1,6 --seeds 1 --dry-run --out "$1" > "$1.txt" &&
    echo "$(grep -q "^bench-sphere note: the full tier runs Table 1" "$1.txt" && echo note) cheetah-runs=$(grep -c "/cheetah/crl/" "$1.txt") reach-runs=$(grep -c "/reach/" "$1.txt")"' "$bin" "$tmp/sph-plan-paper"
expect 2 "bench sphere: a plan with nothing to run is refused, not reported as done" "nothing to run or tabulate: .*on the cheetah alone" -- \
    "$bin" bench sphere --tier full --families reach --figures 1 --dry-run --out "$tmp/sph-plan-paper"
expect 2 "bench sphere: a --rhos ratio must be positive" "--rhos: '-0.01' is not a positive ratio" -- "$bin" bench sphere --rhos 0.1,-0.01 --dry-run
expect 2 "bench sphere: an unknown figure is named with the valid ones" "unknown figure '9' \(2, 3, 13" -- "$bin" bench sphere --figures 2,9
expect 0 "bench sphere: Table 6's baselines run under CRL at their defaults" "--actor moe --specreg 1e-3 .*--init-from" -- \
    "$bin" bench sphere --figures 6 --dry-run --out "$tmp/sph-plan6"
expect 0 "bench sphere: Table 11's SPHERE with LayerNorm runs under CRL" "--actor moe --layernorm 1 --sphere-rho 0.1 --sphere-mode grad --init-from" -- \
    "$bin" bench sphere --figures 11 --dry-run --out "$tmp/sph-plan11"
expect 0 "bench sphere: load balancing overrides the plan's --balance 0" "--balance 0 .*--actor moe --balance 0.01" -- \
    "$bin" bench sphere --figures 6 --dry-run --out "$tmp/sph-plan6"
expect 2 "bench sphere: a --rhos sweep longer than the method table is refused" "--rhos: at most 21 ratios, not 22" -- \
    "$bin" bench sphere --rhos $(seq -s, 1 22) --dry-run
expect 2 "bench sphere: an unknown family is refused" "unknown family 'humanoid'" -- "$bin" bench sphere --families humanoid
sph_tiny="--figures 13,fmnist --seeds 1 --frames 2048 --episodes 2 --states 8 --width 8 --experts 4 --sl-per-class 20 --sl-permuted 2"
expect 0 "bench sphere: a tiny study trains, evaluates and prints SPHERE vs Top-k and Fashion-MNIST" \
    "^\| topk\+sphere \| [0-9.]+ \+- 0 \|" -- sh -c "'$bin' bench sphere $sph_tiny --out '$tmp/sph' && grep -q '\"smoke_test\":\s*true' '$tmp/sph/summary.json' &&
    grep -q '^| sphere | [0-9.]* +- 0 |' '$tmp/sph/summary.md' && [ \$(wc -l < '$tmp/sph/runs.jsonl') -eq 36 ] &&
    grep -q '^| cbp | [0-9.]* +- 0 |' '$tmp/sph/summary.md' && grep -q '^copy of .*/rl/topk/reach-0/s1' '$tmp/sph/reach/crl/topk/s1/0-reach-0/done' &&
    cmp -s '$tmp/sph/reach/rl/topk/reach-0/s1/checkpoint.safetensors' '$tmp/sph/reach/crl/topk/s1/0-reach-0/checkpoint.safetensors'"
expect 0 "bench sphere: a finished study is not run again" "runs=37 to_run=0 " -- "$bin" bench sphere $sph_tiny --out "$tmp/sph"
expect 0 "bench sphere: each run records its command, without the binary and --out; a copy has its source's" \
    "^rl train --agent ppo .* --init-from OUT/reach/crl/topk/s1/0-reach-0/checkpoint.safetensors\$" -- \
    sh -c "cmp -s '$tmp/sph/reach/rl/topk/reach-0/s1/command' '$tmp/sph/reach/crl/topk/s1/0-reach-0/command' &&
    ! grep -q -- '--out' '$tmp/sph/reach/rl/topk/reach-0/s1/command' && cat '$tmp/sph/reach/crl/topk/s1/1-reach-1/command'"
expect 2 "bench sphere: a finished run of another command under the same name is refused, not tabulated" \
    "ran another command than this plan's:.*[0-9]+ finished run\(s\) under .* ran other commands" -- sh -c 'o=$("$0" bench sphere '"$sph_tiny"' --frames 4096 --dry-run --out "$1" 2>&1); rc=$?; echo "$o" | tr "\n" " "; exit $rc' "$bin" "$tmp/sph"
expect 0 "bench sphere: another spelling of --out keeps the runs" "runs=37 to_run=0 " -- \
    sh -c "cd '$tmp' && '$bin' bench sphere $sph_tiny --dry-run --out ./sph"
expect 0 "bench sphere --methods: only those methods' runs (and the held-out policy); each CRL chain's first task is a copy" "runs=13 to_run=11 " -- \
    "$bin" bench sphere --figures 13 --seeds 1 --methods topk,sphere --dry-run --out "$tmp/sph-plan"
expect 0 "bench sphere: a CRL chain's first task takes the files of its RL run (the same command but --out)" \
    "^# copy of .*/reach/rl/topk/reach-0/s1: .*/reach/crl/topk/s1/0-reach-0\$" -- \
    "$bin" bench sphere --figures 13 --seeds 1 --methods topk --dry-run --out "$tmp/sph-plan"
expect 2 "bench sphere --methods: an unknown method is named with the valid ones" "unknown method 'lnn' \(ppo,topk," -- \
    "$bin" bench sphere --methods topk,lnn --dry-run
expect 0 "bench sphere --train 0: tables of the runs done so far, partial cells say n=" "^\| sphere \| [0-9.]+ \+- 0 \(n=1\) \|" -- \
    sh -c "'$bin' bench sphere $sph_tiny --seeds 2 --train 0 --out '$tmp/sph' && [ ! -e '$tmp/sph/reach/crl/sphere/s2' ] &&
    [ ! -e '$tmp/sph/fmnist/split-topk-s2.json' ]"
expect 0 "bench sphere: another --states takes the eNTK rank again and keeps the scores" "eNTK srank at the end \(12 states\)" -- \
    sh -c "r='$tmp/sph/reach/crl/topk/s1/2-reach-2/eval.json'; before=\$(grep '\"return\"' \$r) &&
    grep -q '\"entk_states\":\s*8,' \$r && '$bin' bench sphere $sph_tiny --train 0 --states 12 --out '$tmp/sph' &&
    grep -q '\"entk_states\":\s*12,' \$r && [ \"\$(grep '\"return\"' \$r)\" = \"\$before\" ]"
expect 0 "bench sphere: the reach's held-out batch is random actions' states; a rank taken on another batch is taken again, the scores kept" \
    '"entk_batch":\s*"random"' -- \
    sh -c "r='$tmp/sph/reach/crl/topk/s1/2-reach-2/eval.json'; before=\$(grep '\"return\"' \$r) &&
    sed -i 's/\"entk_batch\":[[:space:]]*\"random\"/\"entk_batch\": \"greedy\"/; s/\"entk_srank\":[[:space:]]*[0-9.e+-]*/\"entk_srank\": -1/' \$r &&
    grep -q '\"entk_srank\": -1' \$r && '$bin' bench sphere $sph_tiny --train 0 --states 12 --out '$tmp/sph' > /dev/null &&
    ! grep -q '\"entk_srank\": -1' \$r && [ \"\$(grep '\"return\"' \$r)\" = \"\$before\" ] && grep -o '\"entk_batch\":.*' \$r"
expect 0 "rl train: an Impala residual block in --arch" "^rl-train env=minatar/breakout agent=dqn frames=300 " -- \
    "$bin" rl train --env minatar/breakout --agent dqn --frames 300 --arch conv:8:3:1:1,res:8,act,dense:16 --out "$tmp/rl_res"
expect 2 "rl train: a residual block whose channels differ from its input's is refused" "layers.1: a residual module needs its output shape equal to its input's" -- \
    "$bin" rl train --env minatar/breakout --agent dqn --frames 300 --arch conv:8:3:1:1,res:4 --out "$tmp/rl_res2"
# pruning experts (SoftMoE-in-RL Fig. 19): during training on a soft router, at evaluation, refusals
expect 0 "rl train: two of four SoftMoE experts pruned during the run" "^rl-train env=minatar/breakout agent=dqn frames=600 " -- \
    "$bin" rl train --env minatar/breakout --agent dqn --frames 600 --learning-starts 100 --arch conv:4:3:1:0,tokens,moe:8,flatten \
    --router soft --experts 4 --prune-experts 2 --prune-from 200 --prune-to 400 --out "$tmp/rl_prune"
expect 0 "rl eval --prune-experts: the policy with two experts dropped" "^rl-eval env=minatar/breakout .*episodes=3 " -- \
    "$bin" rl eval "$tmp/rl_prune/checkpoint.safetensors" --episodes 3 --prune-experts 2
expect 2 "rl eval --prune-experts: every expert pruned is refused" "at least one must stay" -- \
    "$bin" rl eval "$tmp/rl_prune/checkpoint.safetensors" --episodes 3 --prune-experts 4
expect 2 "rl train: pruning a topk network is refused before any work" "the topk router of layer 1 cannot prune experts" -- \
    "$bin" rl train --env minatar/breakout --agent dqn --frames 600 --arch conv:4:3:1:0,moe:8 --experts 4 --prune-experts 1 --out "$tmp/rl_prune2"
expect 2 "rl train: prune_to before prune_from is refused" "prune_to >= prune_from" -- \
    "$bin" rl train --env minatar/breakout --agent dqn --prune-experts 1 --prune-from 10 --prune-to 5 --out "$tmp/rl_prune3"
# ---- SSMoE on collapsed routers (issue 16): bench ssmoe --model upcycle, the probe and their flags ----
expect 2 "bench ssmoe: unknown --model refused" "--model: expected scratch or upcycle" -- "$bin" bench ssmoe --model big
expect 2 "bench ssmoe: probe classes must be held out" "--probe-classes: .*held out" -- \
    "$bin" bench ssmoe --classes 0,1,2 --probe-classes 2,3
expect 2 "bench ssmoe: one class refused" "--classes: need at least 2" -- "$bin" bench ssmoe --classes 3
expect 2 "bench ssmoe: negative --ft-epochs refused" "--ft-epochs >= 0" -- "$bin" bench ssmoe --ft-epochs -1
expect 2 "bench ssmoe: --ft-lr 0 refused" "--ft-lr > 0" -- "$bin" bench ssmoe --ft-lr 0
expect 2 "bench ssmoe: --probe-train beyond the probe classes' images refused" "at most 12000" -- \
    "$bin" bench ssmoe --probe-classes 8,9 --probe-train 12000 --probe-val 10
expect 2 "bench ssmoe: --model upcycle needs an MoE layer to upcycle" "MoE layers" -- \
    "$bin" bench ssmoe --model upcycle --arch dense:16,ffn:16
out=$("$bin" bench ssmoe --model upcycle --dense-epochs 1 --ft-epochs 1 --seeds 1 --configs 4:2 --arch dense:16,moe:16 \
      --alphas 0,1 --cs 5 --calib 100 --probe-train 300 --probe-val 100 --threads 1 --out "$tmp/bsu" 2>&1); rc=$?
acc=$(echo "$out" | sed -n 's/.*dense model | \([0-9.]*\) .*right after upcycling (must equal it) | \([0-9.]*\) .*/\1 \2/p')
read -r a1 a2 <<< "$acc"
if [ $rc -eq 0 ] && [ -n "$a1" ] && [ "$a1" = "$a2" ] && echo "$out" | grep -q "Probe D.6" && [ -s "$tmp/bsu/ssmoe.json" ]; then
    ok "bench ssmoe --model upcycle: the upcycled model scores what the dense one does ($a1), and the probe runs"
else
    bad "bench ssmoe --model upcycle: the upcycled model scores what the dense one does, and the probe runs" \
        "exit $rc, '$acc': $(echo "$out" | tail -n 3)"
fi
expect 0 "bench ssmoe --probe-classes none skips the probe" "expert similarity" -- \
    "$bin" bench ssmoe --probe-classes none --seeds 1 --epochs 1 --configs 4:2 --arch dense:16,moe:16 --alphas 0 --cs 5 \
    --calib 100 --threads 1 --out "$tmp/bsn"
# SR-MoE bench oneshot (issue 16): the surgical update, the Eq. 7 one-shot loss and the lr grid
expect 2 "bench oneshot: an unknown --update refused" "--update: 'sideways' is not surgical, standard or both" -- \
    "$bin" bench oneshot --update sideways
expect 2 "bench oneshot: an unknown --oneshot-loss refused" "--oneshot-loss: 'mse' is not total or ce" -- \
    "$bin" bench oneshot --oneshot-loss mse
expect 2 "bench oneshot: a learning rate <= 0 refused" "--update-lr: '1e-3,0' is not a list of 1-8 learning rates > 0" -- \
    "$bin" bench oneshot --update-lr 1e-3,0
expect 2 "bench oneshot: a trailing comma in --update-lr refused" "--update-lr: '1e-3,' is not a list" -- \
    "$bin" bench oneshot --update-lr 1e-3,
expect 2 "bench oneshot: more than 8 learning rates refused" "--update-lr: .* is not a list of 1-8" -- \
    "$bin" bench oneshot --update-lr 1,2,3,4,5,6,7,8,9
expect 2 "bench oneshot: a fractional --phases count refused" "--phases: '1.5' is not a list" -- "$bin" bench oneshot --phases 1.5
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    out=$("$bin" bench oneshot --seeds 1 --epochs 1 --novel 1 --phases 30 --depths 2x2 --update both --oneshot-loss ce \
        --update-lr 1e-3,3e-2 --out "$tmp/os2" 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "| Top-1 linear | Dense softmax | Clustering | Spectral |" \
        && echo "$out" | grep -q "Mean Δ (standard) at lr 0.03" && echo "$out" | grep -q "Mean Δ (surgical) at lr 0.001" \
        && echo "$out" | grep -q "Summary: mean Δ of the standard update" \
        && grep -q '"update_lr":\[0.001,0.03\],"update":"both","oneshot_loss":"ce"' "$tmp/os2/oneshot.json" \
        && grep -q '"mean_delta_surgical":\[[-0-9.]*,[-0-9.]*\]' "$tmp/os2/oneshot.json"; then
        ok "bench oneshot --update both: four models, both variants at every learning rate, in Markdown and JSON"
    else
        bad "bench oneshot --update both: four models, both variants at every learning rate, in Markdown and JSON" \
            "exit $rc: $(echo "$out" | tail -n 3)"
    fi
    # the learning rate chosen on the selection half's novel images, Delta over the report half
    out=$("$bin" bench oneshot --seeds 1 --epochs 4 --novel 2 --phases 60 --depths 2x2 --update-lr 1e-3,1e-1 \
        --select-novel-acc 0.5 --out "$tmp/os3" 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "Summary at a chosen learning rate: the surgical update" \
        && echo "$out" | grep -Eq "^\| \| Dense softmax \| (0.001|0.1)\*? \| [0-9.]+ \| [0-9.]+ ± [0-9.]+ \| \*\*[-+][0-9.]+ ± [0-9.]+\*\* \|" \
        && grep -q '"select_novel_acc":0.5' "$tmp/os3/oneshot.json" \
        && grep -q '"mean_delta_surgical_report_half":\[[-0-9.]*,[-0-9.]*\]' "$tmp/os3/oneshot.json" \
        && grep -q '"novel_acc_after_surgical_selection_half":\[[0-9.]*,[0-9.]*\]' "$tmp/os3/oneshot.json"; then
        ok "bench oneshot: a learning rate chosen on the selection half, Delta over the report half"
    else
        bad "bench oneshot: a learning rate chosen on the selection half, Delta over the report half" \
            "exit $rc: $(echo "$out" | grep -A3 "chosen learning rate" | head -n 6)"
    fi
else
    echo "skip bench oneshot --update both (dataset-fashion-mnist not installed)"
fi
expect 2 "bench oneshot: --select-novel-acc outside [0, 1] refused" "--select-novel-acc must be a share in \[0, 1\], not 1.5" -- \
    "$bin" bench oneshot --select-novel-acc 1.5
rm -rf "$tmp"
echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
