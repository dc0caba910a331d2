#!/usr/bin/env bash
# Keep your optimizer: sparse methods under momentum SGD and AdamW on the language models.
#   bash studies/optimizers/run.sh lstm "0" "0.01 0.001"      # model, seeds, densities
#   RECIPES="ef21m" METHODS="topk gs" bash studies/optimizers/run.sh lstm "0 1 2" 0.01
#   bash studies/optimizers/run.sh gpt "0" 0.01
# P = 4 as a simulated world (the same aggregators and bytes as 4 processes, tested equal),
# two runs at a time (one core each). lstm: the character LSTM, momentum SGD; lstm-adamw:
# the same LSTM with AdamW; gpt: the character GPT, AdamW. Every run: Shakespeare, STEPS
# steps (default 1500), global batch BATCH (default 128).
# DENSE: dense's lr sweep (lstm: momentum 0.9; otherwise AdamW). RECIPES, each for every sparse
# method in METHODS:
#   sgd     plain SGD (lr 0.2, the pre-#23 default), classic error feedback
#   mom     the optimizer's momentum 0.9 on the classic error-fed update (lr as dense's)
#   momf    mom, each worker sketching only its own 8·k largest coordinates (gs only:
#           --prefilter 8, the many-workers lever, here at P = 4)
#   dgc     DGC: local momentum 0.9 with factor masking, plain SGD (lr as dense's)
#   ef21m   EF21-SGDM: --feedback ef21 --local-momentum 0.9, plain SGD (lr as dense's)
#   ef21    EF21 without momentum, the optimizer's own momentum 0.9 on its estimate
#   glob    the aggregator's momentum 0.9 on the averaged update, masked where delivered
#           (--feedback global), plain SGD (lr as dense's)
#   fetch   FetchSGD (sketched and gs only): momentum 0.9 and error in sketch space, plain
#           SGD, 5 rows with as many numbers per round as gs's default sends (its table and
#           its exact round), no exact round
#   adamw   AdamW on the classic error-fed update (lstm-adamw, gpt; --freeze-variance-after 0)
#   ef21a   AdamW on EF21's estimate (lstm-adamw, gpt)
#   adamwd  AdamW on the classic error-fed update after FREEZE (default 150) dense steps
#           (--start-iter; lstm-adamw, gpt): frozen's dense start without the freeze
#   frozen  1-bit Adam's recipe (lstm-adamw, gpt): FREEZE (default 150) dense AdamW steps,
#           then the variance frozen and the momentum compressed (--freeze-variance-after,
#           --adam-variance frozen, named so the run's config says which it ran)
#           UNSEEN (moving, mask, floor or frozen) chooses what a coordinate the dense
#           steps gave no gradient does (--adam-unseen; default moving)
#   moving  frozen's recipe with the variance kept moving after the dense steps, on the
#           averaged gradient the compressed momentum implies (--adam-variance moving)
# A run is named METHOD-RECIPE-lrLR (sgd: METHOD-sgd, its lr is fixed).
# Raw runs go to DIR (default runs/optimizer, git-ignored; give runs of another length their
# own DIR: a run's name does not say its steps); studies/optimizers/report.py [DIR OUTDIR]
# summarises them.
set -u
cd "$(dirname "$0")/../.." && DIR=${DIR:-runs/optimizer}
source studies/_lib/study_run.sh
MODEL=${1:-lstm}
SEEDS=${2:-"0"}
DENSITIES=${3:-"0.01 0.001"}
STEPS=${STEPS:-1500}
METHODS=${METHODS:-"topk gtopk sketched gs"}
JOBS=${JOBS:-2}
BATCH=${BATCH:-128}
if [ "$MODEL" = gpt ] || [ "$MODEL" = lstm-adamw ]; then
  DENSE=${DENSE:-"0.001 0.003"}; RECIPES=${RECIPES:-"adamw ef21a"}; LR=${LR:-0.003}
  model=(--model "$([ "$MODEL" = gpt ] && echo gpt || echo lm)" --optimizer adamw)
else
  DENSE=${DENSE:-"0.05 0.1 0.2"}; RECIPES=${RECIPES:-"sgd mom dgc ef21m ef21"}; LR=${LR:-0.1}
  model=(--model lm)
fi
fetch_cols() {  # fetch_cols DENSITY: FetchSGD's columns for 5 rows at gs's numbers per round
  .venv/bin/python - "$density" "$MODEL" <<'PY'
import sys
from gssgd.aggregators.options import resolve_k
from gssgd.aggregators.sketching import default_candidates, default_sketch_cols
from gssgd.train.data import load_dataset
from gssgd.train.models import build_model
model = "gpt" if sys.argv[2] == "gpt" else "lm"
d = sum(p.numel() for p in build_model(model, load_dataset("shakespeare")).parameters())
k = resolve_k(d, float(sys.argv[1]), None)
print((default_sketch_cols(d, k) + default_candidates(d, k) * k) // 5)
PY
}
running=0
launch() {  # launch NAME OUT ARGS...: one run in the background, at most JOBS at a time
  local name=$1 out=$2; shift 2
  if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
  execute "$name" "$out/summary.json" .venv/bin/gssgd train "${base[@]}" "$@" --out "$out" &
  running=$((running + 1))
}
for seed in $SEEDS; do
  base=(--simulate --dataset shakespeare "${model[@]}" --workers 4 --global-batch "$BATCH"
        --steps "$STEPS" --seed "$seed" --eval-every 250 --no-progress --overwrite)
  for lr in $DENSE; do
    [ "$MODEL" = lstm ] && mom=(--momentum 0.9) || mom=()
    launch "$MODEL-s$seed-dense-lr$lr" "$DIR/$MODEL/s$seed/dense-lr$lr" --method dense \
      --lr "$lr" "${mom[@]}"
  done
  for density in $DENSITIES; do
    for recipe in $RECIPES; do
      case $recipe in
        sgd) extra=(--lr 0.2 --momentum 0) ;;
        mom) extra=(--lr "$LR" --momentum 0.9) ;;
        momf) extra=(--lr "$LR" --momentum 0.9 --prefilter 8) ;;
        dgc) extra=(--lr "$LR" --momentum 0 --local-momentum 0.9) ;;
        ef21m) extra=(--lr "$LR" --momentum 0 --feedback ef21 --local-momentum 0.9) ;;
        ef21) extra=(--lr "$LR" --momentum 0.9 --feedback ef21) ;;
        glob) extra=(--lr "$LR" --momentum 0 --feedback global --local-momentum 0.9) ;;
        fetch) extra=(--lr "$LR" --momentum 0 --feedback fetchsgd --local-momentum 0.9
                      --rows 5 --cols "$(fetch_cols "$density")") ;;
        adamw) extra=(--lr "$LR" --freeze-variance-after 0) ;;
        ef21a) extra=(--lr "$LR" --feedback ef21) ;;
        frozen) extra=(--lr "$LR" --freeze-variance-after "${FREEZE:-150}"
                       --adam-variance frozen ${UNSEEN:+--adam-unseen "$UNSEEN"}) ;;
        moving) extra=(--lr "$LR" --freeze-variance-after "${FREEZE:-150}"
                       --adam-variance moving) ;;
        adamwd) extra=(--lr "$LR" --start-iter "${FREEZE:-150}" --freeze-variance-after 0) ;;
        *) echo "unknown recipe $recipe"; exit 2 ;;
      esac
      for method in $METHODS; do
        if [ "$recipe" = fetch ]; then
          case $method in sketched) ;; gs) extra+=(--no-exact) ;; *) continue ;; esac
        fi
        [ "$recipe" = momf ] && [ "$method" != gs ] && continue
        name=$method-$recipe; [ "$recipe" != sgd ] && name=$name-lr$LR
        launch "$MODEL-s$seed-d$density-$name" "$DIR/$MODEL/s$seed/d$density/$name" \
          --method "$method" --density "$density" "${extra[@]}"
      done
    done
  done
done
wait
