#!/usr/bin/env bash
# The fair frontier (issue #35): accuracy against bytes, every method at several
# compression levels, under weak scaling (a fixed per-worker batch), simulated world.
#   bash studies/fair_frontier/run.sh "16" "0"                 # P values, seeds
#   DATASET=fashion-mnist bash studies/fair_frontier/run.sh "16 64" "0 1 2"
#   METHODS="gs topk" bash studies/fair_frontier/run.sh 16 0   # a subset
# Every run: the CNN on DATASET (mnist or fashion-mnist), BATCH samples a worker (default
# 16, and 8 from 64 workers, so the global batch P * BATCH stays at most 512), STEPS steps
# (default 400), evaluated every 100. Methods and
# levels (a run is named METHOD-LEVEL):
#   dense-lrX       momentum 0.9 at lr X for each X in DENSE_LRS (default "0.05 0.1"):
#                   dense's small learning-rate sweep at this P; dense16-lrX the same
#                   with a float16 payload (at the first lr of DENSE_LRS only)
#   topk|gtopk|gs|sketched-dD   each sparse method at each density D of DENSITIES
#                   (default "0.001 0.003 0.01"), with its default recipe (plain SGD
#                   with error feedback, lr 0.2, the 100-step density warm-up) and, for
#                   gs and Sketched-SGD, the default sketch shape for its P
#   METHOD-nowu-dD  each sparse method without the density warm-up (--warmup-steps 0) at
#                   each density of NOWU_DENSITIES (default "0.003"): its best version may
#                   skip it; the warm-up's large messages are most of a sparse method's
#                   bytes over a 400-step run (gs at P = 16, density 0.001: 42 kB a step
#                   over the run, 12 kB once the warm-up ends)
#   METHOD-wuW-dD   each sparse method with a light warm-up, from density W (LIGHT_WARMUP,
#                   default 0.02) instead of 0.25, at each density of LIGHT_DENSITIES
#                   (default "0.001 0.003")
#   powersgd-rR     PowerSGD at each rank R of RANKS (default "1 2 4"), when the method
#                   is registered (gssgd's own, error feedback, momentum 0.9 at dense's
#                   learning rate POWERSGD_LR, default DENSE_LRS's first: its authors'
#                   recipe keeps the dense run's optimizer; give dense's best at this P);
#                   named powersgd-lrX-rR when POWERSGD_LR is not DENSE_LRS's first
# Raw runs go to runs/fair-frontier/DATASET (git-ignored); studies/fair_frontier/report.py
# RUNS_DIR OUT_DIR summarises them (studies/fair_frontier/results/DATASET).
set -u
cd "$(dirname "$0")/../.."
DATASET=${DATASET:-mnist}
DIR=${RUNS_DIR:-runs/fair-frontier/$DATASET}
source studies/_lib/study_run.sh
PS=${1:-16}
SEEDS=${2:-0}
BATCH=${BATCH:-}
STEPS=${STEPS:-400}
DENSE_LRS=${DENSE_LRS:-"0.05 0.1"}
DENSITIES=${DENSITIES-"0.001 0.003 0.01"}
RANKS=${RANKS:-"1 2 4"}
NOWU_DENSITIES=${NOWU_DENSITIES-"0.003"}
LIGHT_WARMUP=${LIGHT_WARMUP:-0.02}
LIGHT_DENSITIES=${LIGHT_DENSITIES-"0.001 0.003"}
METHODS=${METHODS:-"dense dense16 topk gtopk gs sketched powersgd"}
has_powersgd=$(.venv/bin/python -c "import gssgd; print(int('powersgd' in gssgd.AGGREGATORS))")
first_lr=${DENSE_LRS%% *}
POWERSGD_LR=${POWERSGD_LR:-$first_lr}
for P in $PS; do
  batch=${BATCH:-$(( P >= 64 ? 8 : 16 ))}
  for seed in $SEEDS; do
    run() { study_train "$@"; }  # studies/_lib/study_run.sh
    for method in $METHODS; do
      case $method in
        dense) for lr in $DENSE_LRS; do run "dense-lr$lr" --method dense --lr "$lr"; done ;;
        dense16) run "dense16-lr$first_lr" --method dense --lr "$first_lr" \
                   --payload-dtype float16 ;;
        powersgd)
          [ "$has_powersgd" = 1 ] || { echo "skip  powersgd: not registered"; continue; }
          for r in $RANKS; do
            name="powersgd-r$r"
            [ "$POWERSGD_LR" = "$first_lr" ] || name="powersgd-lr$POWERSGD_LR-r$r"
            run "$name" --method powersgd --powersgd-rank "$r" --lr "$POWERSGD_LR"
          done ;;
        *) for density in $DENSITIES; do
             run "$method-d$density" --method "$method" --density "$density"
           done
           for density in $NOWU_DENSITIES; do
             run "$method-nowu-d$density" --method "$method" --density "$density" \
               --warmup-steps 0
           done
           for density in $LIGHT_DENSITIES; do
             run "$method-wu$LIGHT_WARMUP-d$density" --method "$method" --density "$density" \
               --warmup-density "$LIGHT_WARMUP"
           done ;;
      esac
    done
  done
done
