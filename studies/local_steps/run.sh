#!/usr/bin/env bash
# Local steps with a compressed outer step (issue #37): the final metric against bytes
# through the busiest link, DiLoCo's dense outer step against sparse and sketched ones,
# beside per-step training at the same per-worker batch and the same total inner steps;
# simulated world.
#   bash studies/local_steps/run.sh "16" "0"              # P values, seeds
#   DATASET=fashion-mnist HS="10 30" bash studies/local_steps/run.sh 16 "0 1 2"
#   MODEL=lm HS="10 30 100" bash studies/local_steps/run.sh 16 0
# MODEL cnn (default): the CNN on DATASET (default mnist), momentum SGD at lr 0.05 (dense's
# recipe), BATCH samples a worker (default 16, 8 from 64 workers), STEPS inner steps
# (default 400), evaluated every 100.
# MODEL lm or gpt: the character model on shakespeare with AdamW at LR (default 0.01 for
# lm, 0.0003 for gpt: dense AdamW's best lr at P = 4 in docs/study.md), BATCH windows a
# worker (default 8), STEPS (default 1500), evaluated every 250.
# Runs (named NAME):
#   dense              per-step dense DDP with the inner recipe: the reference
#   STEP-dD            per-step STEP_METHODS (cnn default "gs", lm/gpt "topk gs") at STEP_DENSITY
#                      (cnn 0.001, lm/gpt 0.01): cnn with the method's own SGD recipe, lm/gpt
#                      with AdamW at LR and 1-bit Adam's recipe (150 dense steps, then the
#                      variance frozen)
#   diloco-HH          local steps, H of HS (default "10 30"), the outer step dense (DiLoCo)
#   METHOD-HH-dD       local steps with METHOD (OUTER_METHODS, default "topk gs") as the
#                      outer step at each density D of OUTER_DENSITIES (default "0.01 0.05")
#                      for H in OUTER_HS (default: HS), for each OUTER_RECIPES (default
#                      "nesterov"; "slc" adds the suffix -slc):
#     nesterov         DiLoCo's outer step: Nesterov at lr 0.7, momentum 0.9, classic error
#                      feedback
#     slc              SparseLoCo's: the residual decayed by 0.95 before each
#                      pseudo-gradient joins it (the decayed error feedback stands in for the
#                      outer momentum), plain SGD at lr 1 outside
# Inner steps: the recipe above (the inner optimizer trains alone); no density warm-up.
# Raw runs go to runs/local-steps/DATASET (cnn) or runs/local-steps/MODEL (git-ignored).
set -u
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-cnn}
if [ "$MODEL" = cnn ]; then
  DATASET=${DATASET:-mnist}; STEPS=${STEPS:-400}; EVAL_EVERY=100
  inner=(--lr 0.05); step=(); STEP_METHODS=${STEP_METHODS:-gs}; STEP_DENSITY=${STEP_DENSITY:-0.001}
  DIR=${RUNS_DIR:-runs/local-steps/$DATASET}
else
  DATASET=shakespeare; STEPS=${STEPS:-1500}; EVAL_EVERY=250
  LR=${LR:-$([ "$MODEL" = gpt ] && echo 0.0003 || echo 0.01)}
  inner=(--optimizer adamw --lr "$LR"); step=("${inner[@]}"); STEP_METHODS=${STEP_METHODS:-"topk gs"}
  STEP_DENSITY=${STEP_DENSITY:-0.01}; DIR=${RUNS_DIR:-runs/local-steps/$MODEL}
fi
source studies/_lib/study_run.sh
PS=${1:-16}
SEEDS=${2:-0}
HS=${HS:-"10 30"}
OUTER_HS=${OUTER_HS:-$HS}
OUTER_METHODS=${OUTER_METHODS:-"topk gs"}
OUTER_DENSITIES=${OUTER_DENSITIES:-"0.01 0.05"}
OUTER_RECIPES=${OUTER_RECIPES:-nesterov}
for P in $PS; do
  if [ "$MODEL" = cnn ]; then batch=${BATCH:-$(( P >= 64 ? 8 : 16 ))}; else batch=${BATCH:-8}; fi
  for seed in $SEEDS; do
    run() { study_train "$@" "${inner[@]}"; }  # studies/_lib/study_run.sh
    if [ "$MODEL" = cnn ]; then run dense-lr0.05 --method dense; else run dense --method dense; fi
    for method in $STEP_METHODS; do
      study_train "$method-d$STEP_DENSITY" --method "$method" --density "$STEP_DENSITY" \
        "${step[@]}"
    done
    for H in $HS; do
      run "diloco-H$H" --method dense --local-steps "$H"
    done
    for recipe in $OUTER_RECIPES; do
      case $recipe in
        nesterov) suffix=""; outer=() ;;
        slc) suffix=-slc; outer=(--outer-error-decay 0.95 --outer-momentum 0 --outer-lr 1) ;;
        *) echo "unknown outer recipe $recipe"; exit 2 ;;
      esac
      for H in $OUTER_HS; do
        for method in $OUTER_METHODS; do
          for density in $OUTER_DENSITIES; do
            run "$method-H$H-d$density$suffix" --method "$method" --density "$density" \
              --local-steps "$H" "${outer[@]}"
          done
        done
      done
    done
  done
done
