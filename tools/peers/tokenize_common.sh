# Sourced by tools/peers/compare_tokenize.sh, tokenize_updates.sh and tokenize_encoders.sh: the
# networks of the full tier's plan, and the field / median / ratio helpers of their summaries.

# tokenize_plan EXCLUDE [bench tokenize flags...]: "VARIANT FLAGS" per Rainbow-lite run on Breakout
# seed 1 of `build/specmoe bench tokenize --tier full --dry-run` (FLAGS from --arch on), leaving out
# the runs whose command line matches the grep pattern EXCLUDE ("" keeps all); with --encoder E
# among the flags, the networks on that encoder. The binary is $TOKENIZE_SPECMOE (build/specmoe)
tokenize_plan() {
    local exclude=$1
    shift
    "${TOKENIZE_SPECMOE:-build/specmoe}" bench tokenize --tier full --dry-run --games breakout --seeds 1 --out /tmp/tokenize-plan "$@" |
        grep -- '--agent rainbow' | { if [ -n "$exclude" ]; then grep -v -- "$exclude"; else cat; fi; } |
        sed -n 's#.*/rainbow-[a-z]*/\([^/ ]*\)/breakout-s1 .*\(--arch .*\)#\1 \2#p'
}
# field LINE KEY: the value of KEY=VALUE in LINE
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p" | head -n 1; }
# median of the numbers on stdin, one a line
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# calc EXPR [DECIMALS]
calc() { awk "BEGIN {printf \"%.${2:-1}f\", $1}"; }
