#!/usr/bin/env bash
# The aggregation benchmark grid of docs/benchmarks.md: `gssgd bench comm` at P = 4 and 8,
# d = 1M, 10M and 25M, density 0.001, on 100 Mbit/s and 1 Gbit/s links, every method
# (all gs levers included), one run per cell, strictly one after another.
#
#   sudo studies/aggregation_grid/run.sh                  # as root: namespaces + tbf (else loopback)
#   .venv/bin/python studies/aggregation_grid/report.py --doc docs/benchmarks.md   # tables + grid.png
#   RAW=/tmp/grid DOCS=/tmp/grid-docs WORKERS="8" DS="1000000" studies/aggregation_grid/run.sh
#   METHODS=powersgd,powersgd-r1 DOCS=/tmp/some-cells studies/aggregation_grid/run.sh
#   ARCH=resnet RAW=runs/grid-today DOCS=studies/cost_model/grid studies/aggregation_grid/run.sh
#
# Each cell's raw output (workers/ with the per-rank records, run.log with the run's
# stdout+stderr) lands in $RAW/comm_P<P>_d<d>M_<link>/ (default runs/grid, ignored by git);
# its summary (results.json; its table.txt with the compress / communicate / decompress
# split and its plot comm.png stay in $RAW) is then copied to $DOCS/comm_P<P>_d<d>M_<link>/ (default
# studies/aggregation_grid/results) by tools/publish_results.sh. A cell whose summary exists in $DOCS is skipped, so the grid
# can be stopped and started again; delete a cell's folder under $DOCS to measure it again.
# Larger vectors get fewer timed steps (a dense step of d = 25M takes ~12 s at 100 Mbit/s).
set -u
cd "$(dirname "$0")/../.."
GSSGD=${GSSGD:-.venv/bin/gssgd}
RAW=${RAW:-runs/grid}
DOCS=${DOCS:-studies/aggregation_grid/results}
WORKERS=${WORKERS:-"8 4"}
DS=${DS:-"1000000 10000000 25000000"}
LINKS=${LINKS:-"100mbit 1gbit"}
METHODS=${METHODS:-}  # a comma-separated subset of bench comm's methods (default: all)
ARCH=${ARCH:-}        # resnet or transformer: PowerSGD over those layer shapes (default: one matrix)
mkdir -p "$RAW"

for d in $DS; do
    case $d in
        1000000) steps=(--repeats 10 --warmup 2) ;;
        *) steps=(--repeats 5 --warmup 1) ;;
    esac
    for p in $WORKERS; do
        for link in $LINKS; do
            cell=comm_P${p}_d$((d / 1000000))M_$link
            if [ -f "$DOCS/$cell/results.json" ]; then
                echo "skip  $cell ($DOCS/$cell/results.json exists)"
                continue
            fi
            echo "run   $cell ($(date -u +%H:%M:%S))"
            if "$GSSGD" bench comm --workers "$p" --d "$d" --density 0.001 --link "$link" \
                ${METHODS:+--methods "$METHODS"} ${ARCH:+--arch "$ARCH"} "${steps[@]}" --out "$RAW/$cell" \
                > "$RAW/$cell.log" 2>&1; then
                mv "$RAW/$cell.log" "$RAW/$cell/run.log"
                PLOTS=0 TABLES=0 tools/publish_results.sh "$RAW/$cell" "$DOCS/$cell"
            else
                echo "FAIL  $cell: see $RAW/$cell.log"
            fi
        done
    done
done
