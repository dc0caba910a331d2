#!/usr/bin/env bash
# Run (or continue) lr-grid cells and publish each finished summary.
#   bash studies/lr_grid/run.sh mnist_p16             # cells: specs/<cell>.toml
# Each cell: `gssgd study specs/<cell>.toml --out runs/lr-grid/<cell>` (a killed cell
# continues where it stopped), then its summary.json, summary.md and curves.png are copied
# to results/<cell>/ and the runs and CPU-hours it printed are shown (quote them in the
# README; the raw runs and the log stay in runs/, git-ignored). JOBS methods are searched at once (default: one per
# core; the summary does not depend on it).
set -euo pipefail
cd "$(dirname "$0")/../.."
for cell in "$@"; do
  out=runs/lr-grid/$cell
  mkdir -p runs/lr-grid "studies/lr_grid/results/$cell"
  .venv/bin/gssgd study "studies/lr_grid/specs/$cell.toml" --out "$out" --no-progress \
    --jobs "${JOBS:-$(nproc)}" > "runs/lr-grid/$cell.log" 2>&1
  cp "$out/summary.json" "$out/summary.md" "$out/curves.png" "studies/lr_grid/results/$cell/"
  grep "CPU-hours" "runs/lr-grid/$cell.log"
  echo "published studies/lr_grid/results/$cell"
done
