#!/usr/bin/env bash
# The P = 64 check of issue #48: did the simulated ring's new summation order (commit
# 10f6203, gloo's ring order instead of rank order) change gs's accuracy, or is it seed
# noise? gs, MNIST CNN, 64 simulated workers, global batch 128, density 0.001, 300 steps,
# seeds 0-2, with the package before the change (10f6203^) and after it (AFTER, default
# 60203b5: the last commit before issue #48 changed gs). Each tree is a git worktree under
# runs/ring-order/; PYTHONPATH pins the package to it. About 8 minutes a run on 2 cores.
#   bash studies/ring_order_check/run.sh && .venv/bin/python studies/ring_order_check/report.py
set -u
cd "$(dirname "$0")/../.."
DIR=runs/ring-order
AFTER=${AFTER:-60203b5}
mkdir -p "$DIR"
for tree in before after; do
  rev=$([ "$tree" = before ] && echo "10f6203^" || echo "$AFTER")
  [ -d "$DIR/$tree" ] || git worktree add -f "$DIR/$tree" "$rev" -q
done
for seed in 0 1 2; do
  for tree in before after; do
    out=$PWD/$DIR/runs/$tree-s$seed
    [ -f "$out/summary.json" ] && continue
    mkdir -p "$DIR/runs"
    (cd "$DIR/$tree" && PYTHONPATH=$PWD "$OLDPWD/.venv/bin/python" -m gssgd.cli.main train \
      --simulate --workers 64 --global-batch 128 --method gs --density 0.001 --steps 300 \
      --seed "$seed" --dataset mnist --no-progress --out "$out" > "$out.log" 2>&1)
  done
done
