#!/usr/bin/env bash
# Which part of the narrow shape costs the character LSTM, and what 40·k float16 columns
# with m = 8 and the ring would cost each model below 16 workers (issue #48). Runs go to
# runs/sizing-shapes/P<P>/<model>-<shape>-s<seed>/ (git-ignored); the table:
#   .venv/bin/python studies/sizing/shapes_report.py runs/sizing-shapes > studies/sizing/results/shapes.md
# SECTION=rule or SECTION=fashion runs only that section (the adopted rule's arm; Fashion-MNIST). Cost on the 2-core machine: ~1 min a CNN run, ~3 min an LSTM run at P = 4 (5 at P = 8);
# the whole grid ~2.5 CPU-hours.
set -euo pipefail
cd "$(dirname "$0")/../.."
R=runs/sizing-shapes
T=".venv/bin/gssgd train --simulate --no-progress"
TRACE=".venv/bin/python studies/sizing/audit_trace.py train --simulate --no-progress"
CNN="--dataset mnist --model cnn --steps 400 --eval-every 100"   # global batch 16 P
LM="--dataset shakespeare --model lm --steps 600 --eval-every 100 --global-batch 128"
GS="--method gs --density 0.001"
shape() {  # shape name, k -> the flags (default: none)
  local c16=$((16 * $2)) c40=$((40 * $2)) wire="--table-dtype float16 --prefilter 8 --allreduce backend"
  case $1 in
    default) echo "--cols $c40 --candidates 32 --table-dtype float32 --prefilter 8 --allreduce recursive_doubling" ;;  # the default before #48
    narrow) echo "--cols $c16 --candidates 8 $wire" ;;
    narrow-m32) echo "--cols $c16 --candidates 32 $wire" ;;
    wide-m8) echo "--cols $c40 --candidates 8 --table-dtype float32 --prefilter 8 --allreduce recursive_doubling" ;;
    wide16-m8) echo "--cols $c40 --candidates 8 $wire" ;;
    wide16-m32) echo "--cols $c40 --candidates 32 $wire" ;;
  esac
}
K_CNN=81; K_LM=248   # round(0.001 d): d = 80,602 and 247,636
if [ "${SECTION:-all}" = all ]; then
# P = 4, seed 0: every shape, the guard's recall traced
for s in default narrow narrow-m32 wide16-m8; do
  $TRACE $CNN --workers 4 --global-batch 64 --seed 0 $GS $(shape $s $K_CNN) --out $R/P4/cnn-$s-s0
done
for s in default narrow narrow-m32 wide16-m8 wide16-m32; do
  $TRACE $LM --workers 4 --seed 0 $GS $(shape $s $K_LM) --out $R/P4/lm-$s-s0
done
# m = 8 with float32 tables (the default's dtype and all-reduce): three seeds at P = 4
for seed in 0 1 2; do
  $T $CNN --workers 4 --global-batch 64 --seed $seed $GS $(shape wide-m8 $K_CNN) --out $R/P4/cnn-wide-m8-s$seed
  $T $LM --workers 4 --seed $seed $GS $(shape wide-m8 $K_LM) --out $R/P4/lm-wide-m8-s$seed
done
# three seeds for the default and the candidate small-P shape, and dense, at P = 4 and 8
for seed in 0 1 2; do
  for P in 4 8; do
    $T $CNN --workers $P --global-batch $((16 * P)) --seed $seed --method dense --lr 0.05 --out $R/P$P/cnn-dense-s$seed
  done
  $T $LM --workers 4 --seed $seed --method dense --out $R/P4/lm-dense-s$seed
  $T $LM --workers 8 --seed $seed --method dense --out $R/P8/lm-dense-s$seed
  for P in 4 8; do
    [ "$P$seed" = 40 ] && continue   # traced above
    $T $CNN --workers $P --global-batch $((16 * P)) --seed $seed $GS $(shape default $K_CNN) --out $R/P$P/cnn-default-s$seed
    $T $LM --workers $P --seed $seed $GS $(shape default $K_LM) --out $R/P$P/lm-default-s$seed
  done
  for P in 4 8; do
    [ "$P$seed" = 40 ] && continue
    $T $CNN --workers $P --global-batch $((16 * P)) --seed $seed $GS $(shape wide16-m8 $K_CNN) --out $R/P$P/cnn-wide16-m8-s$seed
    $T $LM --workers $P --seed $seed $GS $(shape wide16-m8 $K_LM) --out $R/P$P/lm-wide16-m8-s$seed
  done
done
fi
# the rule adopted below 16 workers (float16 tables and the ring, 40·k columns, m = 32):
# three seeds at P = 4 and 8 (runs already there are kept); alone with SECTION=rule
if [ "${SECTION:-all}" != fashion ]; then
for seed in 0 1 2; do
  for P in 4 8; do
    for model in cnn lm; do
      out=$R/P$P/$model-wide16-m32-s$seed
      [ -f $out/summary.json ] && continue
      if [ $model = cnn ]; then
        $T $CNN --workers $P --global-batch $((16 * P)) --seed $seed $GS $(shape wide16-m32 $K_CNN) --out $out
      else
        $T $LM --workers $P --seed $seed $GS $(shape wide16-m32 $K_LM) --out $out
      fi
    done
  done
done
fi
# the same CNN on Fashion-MNIST at P = 4: dense, the earlier default, the rule (SECTION=fashion)
if [ "${SECTION:-all}" = all ] || [ "${SECTION:-all}" = fashion ]; then
FASHION="--dataset fashion-mnist --model cnn --steps 400 --eval-every 100 --workers 4 --global-batch 64"
for seed in 0 1 2; do
  for s in dense default wide16-m32; do
    out=$R/P4/fashion-$s-s$seed
    [ -f $out/summary.json ] && continue
    if [ $s = dense ]; then
      $T $FASHION --seed $seed --method dense --lr 0.05 --out $out
    else
      $T $FASHION --seed $seed $GS $(shape $s $K_CNN) --out $out
    fi
  done
done
fi
