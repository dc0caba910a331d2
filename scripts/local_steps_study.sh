#!/usr/bin/env bash
# Local steps with a compressed outer step (issue #37): accuracy against bytes through the
# busiest link, DiLoCo's dense outer step against sparse and sketched ones, beside per-step
# training at the same per-worker batch and the same total inner steps; simulated world.
#   bash scripts/local_steps_study.sh "16" "0"              # P values, seeds
#   DATASET=fashion-mnist HS="10 30" bash scripts/local_steps_study.sh 16 "0 1 2"
# Every run: the CNN on DATASET (default mnist), BATCH samples a worker (default 16, 8 from
# 64 workers), STEPS inner steps (default 400), evaluated every 100. Runs (named NAME):
#   dense-lr0.05       per-step dense DDP (momentum 0.9): the reference
#   gs-d0.001          per-step gs at its default recipe (the fair frontier's level)
#   diloco-HH          local steps, H of HS (default "10 30"), the outer step dense (DiLoCo)
#   METHOD-HH-dD       local steps with METHOD (OUTER_METHODS, default "topk gs") as the
#                      outer step at each density D of OUTER_DENSITIES (default "0.01 0.05")
# Inner steps: momentum SGD at dense's lr (the inner optimizer trains alone); outer step:
# Nesterov at DiLoCo's lr 0.7 and momentum 0.9, error feedback, no density warm-up.
# Raw runs go to runs/local-steps/DATASET (git-ignored).
set -u
cd "$(dirname "$0")/.."
DATASET=${DATASET:-mnist}
DIR=${RUNS_DIR:-runs/local-steps/$DATASET}
source scripts/lib/study_run.sh
PS=${1:-16}
SEEDS=${2:-0}
STEPS=${STEPS:-400}
HS=${HS:-"10 30"}
OUTER_METHODS=${OUTER_METHODS:-"topk gs"}
OUTER_DENSITIES=${OUTER_DENSITIES:-"0.01 0.05"}
for P in $PS; do
  batch=${BATCH:-$(( P >= 64 ? 8 : 16 ))}
  for seed in $SEEDS; do
    run() { study_train "$@"; }  # scripts/lib/study_run.sh
    run dense-lr0.05 --method dense --lr 0.05
    run gs-d0.001 --method gs --density 0.001
    for H in $HS; do
      run "diloco-H$H" --method dense --local-steps "$H"
      for method in $OUTER_METHODS; do
        for density in $OUTER_DENSITIES; do
          run "$method-H$H-d$density" --method "$method" --density "$density" --local-steps "$H"
        done
      done
    done
  done
done
