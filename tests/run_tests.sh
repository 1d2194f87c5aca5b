#!/usr/bin/env bash
# Runs every test binary given as arguments, then the CLI checks (tests/cli_tests.sh), and prints
# one closing line "N passed, N failed" over all Criterion tests and CLI checks.
set -u
here=$(cd "$(dirname "$0")" && pwd)
pass=0; fail=0; status=0
for t in "$@"; do
    echo "== $t"
    out=$("$t" --jobs 1 2>&1); rc=$?
    echo "$out" | grep -vE '^\[----\]' | tail -n 40
    syn=$(echo "$out" | grep -E 'Synthesis: Tested' | tail -n 1)
    p=$(echo "$syn" | sed -nE 's/.*Passing: ([0-9]+).*/\1/p'); p=${p:-0}
    f=$(echo "$syn" | sed -nE 's/.*Failing: ([0-9]+).*Crashing: ([0-9]+).*/\1 \2/p')
    f1=${f% *}; f2=${f#* }; f1=${f1:-0}; f2=${f2:-0}
    if [ -z "$syn" ] || [ $rc -ne 0 ]; then status=1; [ "$f1$f2" = "00" ] && f1=1; fi
    pass=$((pass + p)); fail=$((fail + f1 + f2))
done
if [ -n "${SPECMOE_BIN:-}" ]; then
    [ -x "$here/cli_tests.sh" ] || { echo "tests/cli_tests.sh is missing or not executable"; exit 1; }
    echo "== tests/cli_tests.sh"
    out=$("$here/cli_tests.sh" "$SPECMOE_BIN" 2>&1); rc=$?
    echo "$out" | tail -n 60
    p=$(echo "$out" | sed -nE 's/^cli: ([0-9]+) passed, ([0-9]+) failed$/\1/p'); p=${p:-0}
    f=$(echo "$out" | sed -nE 's/^cli: ([0-9]+) passed, ([0-9]+) failed$/\2/p'); f=${f:-1}
    [ $rc -ne 0 ] && status=1 && [ "$f" = 0 ] && f=1
    pass=$((pass + p)); fail=$((fail + f))
fi
# the 2-rank MPI checks (tests/mpi_tests.sh prints a SKIP line with the reason when it cannot run them)
if [ -n "${SPECMOE_MPI_CHECK:-}" ] && [ -n "${SPECMOE_BIN:-}" ]; then
    echo "== tests/mpi_tests.sh"
    out=$("$here/mpi_tests.sh" "$SPECMOE_BIN" "$SPECMOE_MPI_CHECK" "${SPECMOE_MPI:-0}" 2>&1); rc=$?
    echo "$out" | tail -n 30
    p=$(echo "$out" | sed -nE 's/^mpi: ([0-9]+) passed, ([0-9]+) failed$/\1/p'); p=${p:-0}
    f=$(echo "$out" | sed -nE 's/^mpi: ([0-9]+) passed, ([0-9]+) failed$/\2/p'); f=${f:-1}
    [ $rc -ne 0 ] && status=1 && [ "$f" = 0 ] && f=1
    pass=$((pass + p)); fail=$((fail + f))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ] && [ $status -eq 0 ]
