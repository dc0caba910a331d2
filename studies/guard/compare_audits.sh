#!/usr/bin/env bash
# issue #48: both audits side by side on the guard study's healthy and too-small sketches
# (MNIST CNN, P = 16, global batch 128, density 0.001, 400 steps), seeds 0 and 1
cd "$(dirname "$0")/../.." && mkdir -p runs/guard-audits
k=81
for seed in 0 1; do
  for shape in default "$((8 * k)):4" "$((2 * k)):2"; do
    name=${shape/:/-m}; extra=()
    if [ "$shape" != default ]; then extra=(--cols "${shape%%:*}" --candidates "${shape##*:}" --prefilter 0); fi
    .venv/bin/python studies/guard/train_with_log.py train --simulate --workers 16 --global-batch 128 \
      --dataset mnist --method gs --density 0.001 --steps 400 --eval-every 100 --seed $seed \
      --opt audit=both "${extra[@]}" --no-progress --overwrite --out runs/guard-audits/s$seed-$name \
      > runs/guard-audits/s$seed-$name.log 2>&1
  done
done

