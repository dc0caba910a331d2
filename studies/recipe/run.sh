#!/usr/bin/env bash
# The training-recipe study (docs/study.md, "Recipe"): which recipe lets sparse methods keep
# dense's accuracy at density 0.001 and 0.0001 (MNIST CNN, 4 workers, 400 steps).
#
#   studies/recipe/run.sh sweep      # part R1: learning rates of plain SGD + error feedback
#   studies/recipe/run.sh levers     # part R2: density warm-up, local momentum
#   studies/recipe/run.sh sweep2     # part R2b: lr 0.8, and warm-up at lr 0.4, every method
#   studies/recipe/run.sh seeds      # part R3: the chosen recipe, seeds 0-2, both densities
#   studies/recipe/run.sh seeds2     # part R4: lr 0.2 +/- warm-up, seeds 0-2, both densities
#   studies/recipe/run.sh d01    # part R5: the default recipe at density 0.01, seeds 0-2
#   studies/recipe/run.sh lm         # part R6: Shakespeare LSTM, P = 4: lr sweep on seed 0,
#                                      # then each method's best lr on seeds 1-2
#   studies/recipe/run.sh p8         # part R7: `gssgd compare --workers 8` (the defaults), seeds 1-2
#   studies/recipe/run.sh gentle     # part R8: a warm-up from density 0.01, not 0.25 (bytes)
#   studies/recipe/run.sh lmgrid     # part R9: Shakespeare at densities 0.01 and 0.0001, seeds 0-2
#   studies/recipe/run.sh p8grid     # part R10: P = 8 at densities 0.01 and 0.0001, seeds 0-2
#   studies/recipe/run.sh lmwhy      # part R11: why Shakespeare misses: dense without momentum,
#                                      # topk with local momentum (seed 0)
#   .venv/bin/python studies/recipe/report.py   # studies/recipe/results/recipe.json and recipe.md
#
# Raw runs go to $RECIPE_DIR (default runs/recipe, git-ignored): runs/<name>/ per run,
# logs/<name>.log and logs/status.tsv. Idempotent: finished runs are skipped. Sequential.
set -u
cd "$(dirname "$0")/../.."
GSSGD=${GSSGD:-.venv/bin/gssgd}
DIR=${RECIPE_DIR:-runs/recipe}
mkdir -p "$DIR/runs"
source studies/_lib/study_run.sh  # execute NAME DONE_FILE COMMAND..., logs/status.tsv
COMMON=(--dataset mnist --model cnn --workers 4 --steps 400 --batch-size 32 --eval-every 100)
LM=(--dataset shakespeare --model lm --workers 4 --steps 200 --batch-size 32 --seq-len 64
    --eval-every 50)

run() {  # run NAME ARGS...: one `gssgd train` run of the part's setting (BASE) into runs/NAME
    local name=$1; shift
    local out=$DIR/runs/$name
    execute "$name" "$out/summary.json" \
        "$GSSGD" train "${BASE[@]}" "$@" --no-progress --out "$out" --overwrite
}

best_lr() {  # best_lr PREFIX SUFFIX LR...: the lr whose seed-0 run ended with the lowest test loss
    local prefix=$1 suffix=$2; shift 2
    .venv/bin/python - "$DIR/runs" "$prefix" "$suffix" "$@" <<'PY'
import json, math, sys
from pathlib import Path
runs, prefix, suffix, lrs = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
def loss(lr: str) -> float:
    path = runs / f"{prefix}{lr}{suffix}" / "summary.json"
    if not path.exists():
        return math.inf
    summary = json.loads(path.read_text())
    value = summary.get("final_test_loss")
    ok = summary.get("status") == "completed" and value is not None and math.isfinite(value)
    return value if ok else math.inf
print(min(lrs, key=loss))
PY
}

BASE=("${COMMON[@]}")
part=${1:-sweep}
case $part in
  sweep)
    run dense-m0.9-lr0.05-s0 --method dense --momentum 0.9 --lr 0.05 --seed 0
    run dense-m0-lr0.2-s0 --method dense --momentum 0 --lr 0.2 --seed 0
    for lr in 0.1 0.2 0.4; do
      for m in gs topk gtopk sketched; do
        run "$m-m0-lr$lr-d0.001-s0" --method "$m" --momentum 0 --lr "$lr" --density 0.001 --seed 0
      done
    done ;;
  levers)
    LR=${LR:-0.2}
    for m in gs topk; do
      run "$m-m0-lr$LR-wu100-d0.001-s0" --method "$m" --momentum 0 --lr "$LR" --density 0.001 \
          --warmup-steps 100 --seed 0
      run "$m-lm0.9-lr0.05-d0.001-s0" --method "$m" --momentum 0 --local-momentum 0.9 --lr 0.05 \
          --density 0.001 --seed 0
    done ;;
  sweep2)
    for m in gs topk gtopk sketched; do
      run "$m-m0-lr0.8-d0.001-s0" --method "$m" --momentum 0 --lr 0.8 --density 0.001 --seed 0
      run "$m-m0-lr0.4-wu100-d0.001-s0" --method "$m" --momentum 0 --lr 0.4 --density 0.001 \
          --warmup-steps 100 --seed 0
    done ;;
  seeds)  # LR_<method>=... and WU_<method>=... pick each method's lr (default 0.4, the
          # sweep's best for every method) and density warm-up steps (default 0: off)
    for seed in 0 1 2; do  # dense sends everything: one run per seed serves both densities
      run "dense-m0.9-lr0.05-s$seed" --method dense --momentum 0.9 --lr 0.05 --seed "$seed"
    done
    for density in 0.001 0.0001; do
      for seed in 0 1 2; do
        for m in topk gtopk sketched gs; do
          var="LR_${m}"; lr=${!var:-0.4}
          var="WU_${m}"; wu=${!var:-0}
          tag=$([ "$wu" -gt 0 ] && echo "-wu$wu")
          run "$m-m0-lr$lr$tag-d$density-s$seed" --method "$m" --momentum 0 --lr "$lr" \
              --warmup-steps "$wu" --density "$density" --seed "$seed"
        done
      done
    done ;;
  seeds2)  # part R4: lr 0.2 with and without 100 warm-up steps at 0.001; lr 0.1 and 0.2 with
           # warm-up at 0.0001 (lr 0.4 collapsed there; 0.1 on seed 0 only); seeds 0-2
    for seed in 0 1 2; do
      for m in topk gtopk sketched gs; do
        run "$m-m0-lr0.2-d0.001-s$seed" --method "$m" --momentum 0 --lr 0.2 --density 0.001 --seed "$seed"
        run "$m-m0-lr0.2-wu100-d0.001-s$seed" --method "$m" --momentum 0 --lr 0.2 --density 0.001 \
            --warmup-steps 100 --seed "$seed"
        lrs="0.2"; [ "$seed" = 0 ] && lrs="0.1 0.2"  # 0.1 lost to 0.2 for every method on seed 0
        for lr in $lrs; do
          run "$m-m0-lr$lr-wu100-d0.0001-s$seed" --method "$m" --momentum 0 --lr "$lr" \
              --density 0.0001 --warmup-steps 100 --seed "$seed"
        done
      done
    done ;;
  d01)  # part R5: the default recipe (lr 0.2, 100 warm-up steps) at density 0.01, and
             # lr 0.4 on seed 0 to see whether the larger k wants a larger rate
    for seed in 0 1 2; do
      for m in topk gtopk sketched gs; do
        run "$m-m0-lr0.2-wu100-d0.01-s$seed" --method "$m" --momentum 0 --lr 0.2 --density 0.01 \
            --warmup-steps 100 --seed "$seed"
        [ "$seed" = 0 ] && run "$m-m0-lr0.4-wu100-d0.01-s0" --method "$m" --momentum 0 --lr 0.4 \
            --density 0.01 --warmup-steps 100 --seed 0
      done
    done ;;
  lm)  # part R6: Shakespeare character LSTM, P = 4, 200 steps, density 0.001. Dense keeps SGD
       # momentum 0.9 (lr 2.0 was the first pass's best, at its grid's edge, so 4.0 too); the
       # sparse methods run plain SGD + error feedback with 50 warm-up steps (a quarter of the
       # run, as 100 of 400 on MNIST) at lr 2.5, 5 and 10; then seeds 1-2 at each one's best lr
    BASE=("${LM[@]}")
    for lr in 2.0 4.0; do
      run "lm-dense-m0.9-lr$lr-s0" --method dense --momentum 0.9 --lr "$lr" --seed 0
    done
    for m in topk gtopk sketched gs; do
      for lr in 2.5 5 10; do
        run "lm-$m-m0-lr$lr-wu50-d0.001-s0" --method "$m" --momentum 0 --lr "$lr" \
            --density 0.001 --warmup-steps 50 --seed 0
      done
    done
    lr=$(best_lr lm-dense-m0.9-lr -s0 2.0 4.0)
    for seed in 1 2; do
      run "lm-dense-m0.9-lr$lr-s$seed" --method dense --momentum 0.9 --lr "$lr" --seed "$seed"
    done
    for m in topk gtopk sketched gs; do
      lr=$(best_lr "lm-$m-m0-lr" -wu50-d0.001-s0 2.5 5 10)
      for seed in 1 2; do
        run "lm-$m-m0-lr$lr-wu50-d0.001-s$seed" --method "$m" --momentum 0 --lr "$lr" \
            --density 0.001 --warmup-steps 50 --seed "$seed"
      done
    done ;;
  p8)  # part R7: the main job's defaults at P = 8 on seeds 1 and 2 (seed 0:
       # studies/recipe/results/main_job_P8.json)
    for seed in 1 2; do
      out=$DIR/runs/p8-s$seed
      execute "p8-s$seed" "$out/results.json" \
          "$GSSGD" compare --workers 8 --seed "$seed" --no-progress --out "$out"
    done ;;
  gentle)  # part R8: the warm-up's first steps dominate a 400-step run's bytes (from density
            # 0.25 they send 4.5 gradients' worth of coordinates); does one from 0.01 keep the
            # accuracy at a tenth of the bytes? topk and gs (the bytes target's methods), seeds 0-2
    for seed in 0 1 2; do
      for m in topk gs; do
        run "$m-m0-lr0.2-wu100from0.01-d0.001-s$seed" --method "$m" --momentum 0 --lr 0.2 \
            --density 0.001 --warmup-steps 100 --warmup-density 0.01 --seed "$seed"
      done
    done ;;
  lmgrid)  # part R9: the rest of the Shakespeare grid, densities 0.01 and 0.0001, each method
            # at lr 5 (R6's best for every method at 0.001), 50 warm-up steps; dense is R6's
    BASE=("${LM[@]}")
    for density in 0.01 0.0001; do
      for seed in 0 1 2; do
        for m in topk gtopk sketched gs; do
          run "lm-$m-m0-lr5-wu50-d$density-s$seed" --method "$m" --momentum 0 --lr 5 \
              --density "$density" --warmup-steps 50 --seed "$seed"
        done
      done
    done ;;
  p8grid)  # part R10: the rest of the P = 8 grid: `gssgd compare --workers 8` (the defaults)
           # at densities 0.01 and 0.0001 without dense (density-free: R7's serves), seeds 0-2
    for density in 0.01 0.0001; do
      for seed in 0 1 2; do
        out=$DIR/runs/p8-d$density-s$seed
        execute "p8-d$density-s$seed" "$out/results.json" \
            "$GSSGD" compare --workers 8 --seed "$seed" --density "$density" \
            --methods topk,gtopk,sketched,gs --no-progress --out "$out"
      done
    done ;;
  lmwhy)  # part R11: is Shakespeare's gap compression or momentum? Dense with plain SGD (the
          # sparse methods' recipe) at lr 5, 10, 20, and topk with DGC's local momentum 0.9 at
          # lr 0.5 and 1 (the same effective step as plain SGD at 5 and 10), density 0.001
    BASE=("${LM[@]}")
    for lr in 5 10 20; do
      run "lm-dense-m0-lr$lr-s0" --method dense --momentum 0 --lr "$lr" --seed 0
    done
    for lr in 0.5 1; do
      run "lm-topk-lm0.9-lr$lr-wu50-d0.001-s0" --method topk --momentum 0 --local-momentum 0.9 \
          --lr "$lr" --density 0.001 --warmup-steps 50 --seed 0
    done ;;
  *) echo "usage: $0 sweep|levers|sweep2|seeds|seeds2|d01|lm|p8|gentle|lmgrid|p8grid|lmwhy" >&2
     exit 2 ;;
esac
