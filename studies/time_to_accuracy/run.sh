#!/usr/bin/env bash
# Time to 90 % on the wide ResNet (wresnet, d = 3.46M, MNIST), P = 4 and 8: the runs behind
# docs/benchmarks.md, "Time to 90 % over three seeds, 1 Gbit/s and P = 8 too".
#
#   studies/time_to_accuracy/run.sh mbit    # every method, emulated 100 Mbit/s links, seeds 0, 1, 2
#   studies/time_to_accuracy/run.sh gslr    # gs alone at 100 Mbit/s, learning rates 0.1 and 0.05, seed 0
#   studies/time_to_accuracy/run.sh gswu    # gs alone at 100 Mbit/s with the default density warm-up
#                                # (100 steps from density 0.25), seed 0
#   studies/time_to_accuracy/run.sh gbit    # every method, emulated 1 Gbit/s links, seeds 0, 1, 2
#   studies/time_to_accuracy/run.sh p8      # every method, 8 workers on 100 Mbit/s links, seed 0
#   studies/time_to_accuracy/run.sh all     # all five, in that order (the default)
#   .venv/bin/python studies/time_to_accuracy/report.py   # studies/time_to_accuracy/results/summary.{json,md}
#
# Every run uses the levers the 100 Mbit/s run used: the backend's ring all-reduce for gs's
# tables, float16 tables on the wire, no density warm-up (its first steps would send a
# quarter of the model), density 0.001, 160 steps of 32 samples per worker, an evaluation
# every 40 steps. Raw runs go to $TTT_DIR (default runs/ttt, git-ignored). Idempotent:
# finished runs are skipped. Needs root (network namespaces) and a quiet machine; run it
# under the measurement lock:  flock /tmp/gssgd-measure.lock studies/time_to_accuracy/run.sh all
set -u
cd "$(dirname "$0")/../.."
GSSGD=${GSSGD:-.venv/bin/gssgd}
DIR=${TTT_DIR:-runs/ttt}
source studies/_lib/study_run.sh  # execute NAME DONE_FILE COMMAND..., logs/status.tsv

ttt() {  # ttt NAME LINK SEED METHODS [EXTRA ARGS...] (a later --workers overrides the 4)
    local name=$1 link=$2 seed=$3 methods=$4; shift 4
    execute "$name" "$DIR/$name/results.json" "$GSSGD" bench train --out "$DIR/$name" \
        --methods "$methods" --link "$link" --workers 4 \
        --dataset mnist --model wresnet --steps 160 --eval-every 40 --density 0.001 \
        --allreduce backend --table-dtype float16 --warmup-steps 0 --method-timeout 1800 \
        --seed "$seed" "$@"
}

ALL=dense,topk,gtopk,sketched,gs
mbit() { for s in 0 1 2; do ttt "mbit-s$s" 100mbit "$s" "$ALL"; done; }
gslr() { for lr in 0.1 0.05; do ttt "gs-lr$lr" 100mbit 0 gs --lr "$lr"; done; }
gswu() { ttt gs-warmup 100mbit 0 gs --warmup-steps 100; }
gbit() { for s in 0 1 2; do ttt "gbit-s$s" 1gbit "$s" "$ALL"; done; }
p8() { ttt p8-s0 100mbit 0 "$ALL" --workers 8; }

case ${1:-all} in
    mbit) mbit ;;
    gslr) gslr ;;
    gswu) gswu ;;
    gbit) gbit ;;
    p8) p8 ;;
    all) mbit; gslr; gswu; gbit; p8 ;;
    *) echo "usage: $0 [mbit|gslr|gswu|gbit|p8|all]" >&2; exit 2 ;;
esac
