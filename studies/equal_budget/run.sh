#!/usr/bin/env bash
# Run (or continue) equal-budget cells and publish each finished summary.
#   bash studies/equal_budget/run.sh mnist_p16 fashion_p16     # cells: specs/<cell>.toml
# Each cell: `gssgd study specs/<cell>.toml --out runs/equal-budget/<cell>` (a killed cell
# continues where it stopped), then its summary.json, summary.md and curves.png are copied
# to results/<cell>/ (the raw runs stay in runs/, git-ignored). JOBS methods are searched at
# once (default: one per core; the summary does not depend on it).
set -euo pipefail
cd "$(dirname "$0")/../.."
for cell in "$@"; do
  out=runs/equal-budget/$cell
  .venv/bin/gssgd study "studies/equal_budget/specs/$cell.toml" --out "$out" --no-progress \
    --jobs "${JOBS:-$(nproc)}" \
    > "runs/equal-budget/$cell.log" 2>&1
  mkdir -p "studies/equal_budget/results/$cell"
  cp "$out/summary.json" "$out/summary.md" "$out/curves.png" "studies/equal_budget/results/$cell/"
  echo "published studies/equal_budget/results/$cell"
done
