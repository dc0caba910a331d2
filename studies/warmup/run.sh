#!/usr/bin/env bash
# Does the exact density warm-up (issue #48) cost compute? gs's warm-up steps and steady
# steps timed on one process with the package before the change (BEFORE, default 60203b5:
# k_t rounded up to k*2^j, one cached sketch per shape) and after it (the working tree),
# alternating, REPEATS times each; and the bytes each warm-up sends at P = 16.
#   bash studies/warmup/run.sh > runs/warmup/times.jsonl
#   .venv/bin/python studies/warmup/report.py runs/warmup/times.jsonl
set -u
cd "$(dirname "$0")/../.."
BEFORE=${BEFORE:-60203b5}
REPEATS=${REPEATS:-3}
D=${D:-1000000}
mkdir -p runs/warmup
[ -d runs/warmup/before ] || git worktree add -f runs/warmup/before "$BEFORE" -q
for _ in $(seq "$REPEATS"); do
  for tree in runs/warmup/before .; do
    PYTHONPATH=$tree .venv/bin/python studies/warmup/time_warmup.py --d "$D"
  done
done
