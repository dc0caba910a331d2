#!/usr/bin/env bash
# Streaming gs (--overlap stream) against whole-model gs (--overlap none): docs/benchmarks.md,
# "Streaming gs: overlap with backward".
#
#   studies/overlap/run.sh overlap    # seconds per step on emulated 100 Mbit/s links (root),
#                                       # 4 workers, Shakespeare: lm, then the gpt model
#   studies/overlap/run.sh accuracy   # MNIST CNN, P = 4, density 0.001, 400 steps, 2 seeds
#   studies/overlap/run.sh all        # both, the most needed runs first (the default)
#   .venv/bin/python studies/overlap/report.py   # studies/overlap/results/summary.{json,md}
#
# Each gs variant is its own `gssgd bench train --methods gs` run (bench train keys its rows
# by method): none (recursive doubling, the default), none with --allreduce backend (the ring
# the streamed regions use) and stream. Raw runs go to $OVERLAP_DIR (default runs/overlap,
# git-ignored). Idempotent: finished runs are skipped. Run under the measurement lock:
#   flock /tmp/gssgd-measure.lock studies/overlap/run.sh overlap
set -u
cd "$(dirname "$0")/../.."
GSSGD=${GSSGD:-.venv/bin/gssgd}
DIR=${OVERLAP_DIR:-runs/overlap}
source studies/_lib/study_run.sh  # execute NAME DONE_FILE COMMAND..., logs/status.tsv

bench() {  # bench NAME ARGS...: one gs variant on the emulated links
    local name=$1; shift
    mkdir -p "$DIR/overlap_logs"  # streamed iterations' OverlapStats, per rank
    GSSGD_OVERLAP_LOG="$PWD/$DIR/overlap_logs/$name" \
    execute "$name" "$DIR/$name/results.json" "$GSSGD" bench train --methods gs --link 100mbit \
        --workers 4 "$@" --out "$DIR/$name"
}

VARIANTS=("none:--overlap none" "backend:--overlap none --allreduce backend"
          "stream:--overlap stream")

lm() {  # lm (d = 247,636): four DDP buckets of about 250 KB; density 0.01 (k = 2,476)
    # shellcheck disable=SC2086
    bench "lm-${1%%:*}" --dataset shakespeare --model lm --steps 60 --eval-every 30 \
        --density 0.01 --bucket-cap-mb 0.25 --seed 0 ${1#*:}
}
gpt() {  # gpt (d = 3.3M): about seven buckets of 2 MB; density 0.01 (k = 33,000)
    # shellcheck disable=SC2086
    bench "gpt-${1%%:*}" --dataset shakespeare --model gpt --steps 30 --eval-every 15 \
        --batch-size 8 --density 0.01 --bucket-cap-mb 2 --seed 0 ${1#*:}
}
mnist() {  # mnist OVERLAP SEED: accuracy at 400 steps, density 0.001, several buckets
    execute "mnist-$1-s$2" "$DIR/mnist-$1-s$2/summary.json" "$GSSGD" train \
        --method gs --dataset mnist --model cnn --workers 4 --steps 400 --batch-size 32 \
        --eval-every 100 --density 0.001 --bucket-cap-mb 0.1 --overlap "$1" \
        --seed "$2" --no-progress --out "$DIR/mnist-$1-s$2" --overwrite
}

part=${1:-all}
case $part in
  overlap) for v in "${VARIANTS[@]}"; do lm "$v"; done
           for v in "${VARIANTS[@]}"; do gpt "$v"; done ;;
  accuracy) for seed in 0 1; do mnist none "$seed"; mnist stream "$seed"; done ;;
  all)  # the most needed first
    lm "${VARIANTS[2]}"; lm "${VARIANTS[0]}"; mnist none 0; mnist stream 0
    lm "${VARIANTS[1]}"; gpt "${VARIANTS[2]}"; gpt "${VARIANTS[0]}"
    mnist none 1; mnist stream 1; gpt "${VARIANTS[1]}" ;;
  *) echo "unknown part $part (overlap, accuracy, all)"; exit 2 ;;
esac
