#!/usr/bin/env bash
# Copy the summary of one benchmark run from runs/ into a study's folder (studies/<study>/results/),
# leaving the raw output behind.
#
#   tools/publish_results.sh RAW_DIR DEST_DIR
#   tools/publish_results.sh runs/results/train_P4_100mbit studies/benchmarks/results/train_P4_100mbit
#
# RAW_DIR is the --out folder of `gssgd bench comm|train|model` (under runs/, which git
# ignores). Only its top-level summaries are copied: results.json, table.txt, model.json,
# tables.txt and the plots (*.png). Everything else stays in RAW_DIR: workers/ (per-rank
# records), per-method training folders (metrics.jsonl, summary.json, config.json, logs/),
# run.log. The plots are sized for the web (studies/_lib/report.py's shrink_png), so the
# committed summaries stay small.
# PLOTS=0 leaves the plots behind too, TABLES=0 the table.txt (the aggregation grid's
# cells: grid.png and studies/aggregation_grid/report.py's tables summarise them, and a
# cell's table is gssgd_lab.comm_report.comm_table of its results.json).
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 RAW_DIR DEST_DIR" >&2
    exit 2
fi
raw=$1
dst=$2
if [ ! -d "$raw" ]; then
    echo "$0: no folder $raw" >&2
    exit 1
fi
# shrink_png FILE: size a plot for the web as every committed plot is (a 256-colour
# palette: studies/_lib/report.py's shrink_png).
shrink_png() {
    "${PYTHON:-.venv/bin/python}" -c 'import sys; from pathlib import Path
sys.path.insert(0, "."); from studies._lib.report import shrink_png; shrink_png(Path(sys.argv[1]))' "$1"
}

mkdir -p "$dst"
copied=0
for f in "$raw"/results.json "$raw"/table.txt "$raw"/model.json "$raw"/tables.txt "$raw"/*.png; do
    [ -f "$f" ] || continue
    case $f in
        *.png) [ "${PLOTS:-1}" = 0 ] && continue ;;
        */table.txt) [ "${TABLES:-1}" = 0 ] && continue ;;
    esac
    cp "$f" "$dst/"
    copied=$((copied + 1))
    case $f in
        *.png) shrink_png "$dst/$(basename "$f")" ;;
    esac
done
if [ "$copied" -eq 0 ]; then
    echo "$0: $raw holds no results.json, table.txt, model.json, tables.txt or *.png" >&2
    exit 1
fi
echo "published $copied file(s): $raw -> $dst"
