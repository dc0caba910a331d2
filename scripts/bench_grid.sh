#!/usr/bin/env bash
# The aggregation benchmark grid of docs/benchmarks.md: `gssgd bench comm` at P = 4 and 8,
# d = 1M, 10M and 25M, density 0.001, on 100 Mbit/s and 1 Gbit/s links, every method
# (all gs levers included), one run per cell, strictly one after another.
#
#   sudo scripts/bench_grid.sh                  # as root: namespaces + tbf (else loopback)
#   OUT=/tmp/grid WORKERS="8" DS="1000000" scripts/bench_grid.sh
#
# Results land in $OUT/comm_P<P>_d<d>_<link>/ (results.json, table.txt, comm.png); a cell
# whose results.json exists is skipped, so the grid can be stopped and started again.
# Larger vectors get fewer timed steps (a dense step of d = 25M takes ~12 s at 100 Mbit/s).
set -u
cd "$(dirname "$0")/.."
GSSGD=${GSSGD:-.venv/bin/gssgd}
OUT=${OUT:-docs/results/grid}
WORKERS=${WORKERS:-"8 4"}
DS=${DS:-"1000000 10000000 25000000"}
LINKS=${LINKS:-"100mbit 1gbit"}

for d in $DS; do
    case $d in
        1000000) steps=(--repeats 10 --warmup 2) ;;
        *) steps=(--repeats 5 --warmup 1) ;;
    esac
    for p in $WORKERS; do
        for link in $LINKS; do
            dir=$OUT/comm_P${p}_d$((d / 1000000))M_$link
            if [ -f "$dir/results.json" ]; then
                echo "skip  $dir"
                continue
            fi
            echo "run   $dir ($(date -u +%H:%M:%S))"
            "$GSSGD" bench comm --workers "$p" --d "$d" --density 0.001 --link "$link" \
                "${steps[@]}" --out "$dir" > "$dir.log" 2>&1 || echo "FAIL  $dir: see $dir.log"
            mv "$dir.log" "$dir/run.log" 2>/dev/null || true
        done
    done
done
