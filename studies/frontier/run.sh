#!/usr/bin/env bash
# Many workers: accuracy against bytes per worker per step, P = 4 to 256, simulated world.
#   bash studies/frontier/run.sh "16 64" "0 1 2"     # P values, seeds
#   METHODS="topk gtopk-nowu" GS_SIZES="16:8:h:8" bash studies/frontier/run.sh 16 0
# Every run: the MNIST CNN, density 0.001, global batch 128 (256 at P >= 256: one sample a
# worker), 400 steps, each method with its default recipe (sparse: plain SGD + error
# feedback, lr 0.2, the 100-step density warm-up; dense: momentum 0.9, lr 0.05).
# METHODS: dense, dense16 (--payload-dtype float16), topk, gtopk, sketched; a "-nowu"
# suffix drops the density warm-up (--warmup-steps 0). GS_SIZES: gs with the ring
# all-reduce (--allreduce backend: its bytes do not grow with P), "c:m[:h[:f[:w[:g]]]]" ->
# gs-c<c>-m<m>[-h][-pf<f>][-nowu][-noguard]: c*k columns, m candidates, h: float16 tables,
# f: --prefilter f, w (any text): no density warm-up, g (any text): --guard off.
# "default" runs gs as it comes; "default:L1:L2..." with levers on top, named gs-L1-L2:
# rR: --reuse R (sketch every R-th step, the exact round at the kept candidates between);
# ef21m: --feedback ef21 --local-momentum 0.9 (EF21-SGDM); dD: --density D instead of 0.001
# (for a comparison at equal bytes); lrX: --lr X (a momentum lever needs a smaller step).
# MODEL=lm: the Shakespeare character LSTM instead (d = 247,636), STEPS (default 1500) steps,
# evaluated every 250, each method with the language models' default recipe (momentum SGD);
# its runs go to runs/frontier-lm.
# Raw runs go to runs/frontier (git-ignored; RUNS_DIR=... elsewhere);
# studies/frontier/report.py summarises them.
set -u
MODEL=${MODEL:-cnn}
cd "$(dirname "$0")/../.." && DIR=${RUNS_DIR:-runs/frontier$([ "$MODEL" = lm ] && echo -lm)}
source studies/_lib/study_run.sh
PS=${1:-"16 64 256"}
SEEDS=${2:-"0 1 2"}
METHODS=${METHODS:-"dense dense16 topk topk-nowu gtopk gtopk-nowu sketched"}
GS_SIZES=${GS_SIZES:-"default 40:32 16:8:h:8 8:8:h:8"}
K=81  # round(0.001 * 80,602): the MNIST CNN's k at density 0.001
data=(--dataset mnist --model cnn --steps 400 --eval-every 100)
if [ "$MODEL" = lm ]; then
  K=248  # round(0.001 * 247,636)
  data=(--dataset shakespeare --model lm --steps "${STEPS:-1500}" --eval-every 250)
fi
for P in $PS; do
  batch=128; [ "$P" -ge 256 ] && batch=$P
  for seed in $SEEDS; do
    base=(--simulate "${data[@]}" --workers "$P" --global-batch "$batch"
          --seed "$seed" --no-progress --overwrite)
    for name in $METHODS; do
      method=${name%-nowu}; extra=()
      [ "$name" != "$method" ] && extra+=(--warmup-steps 0)
      case $method in
        dense) ;;
        dense16) method=dense; extra+=(--payload-dtype float16) ;;
        *) extra+=(--density 0.001) ;;
      esac
      out=$DIR/P$P/s$seed/$name
      execute "P$P-s$seed-$name" "$out/summary.json" \
        .venv/bin/gssgd train --method "$method" "${base[@]}" "${extra[@]}" --out "$out"
    done
    for size in $GS_SIZES; do
      if [ "${size%%:*}" = default ]; then
        name=gs; levers=()
        IFS=: read -r -a parts <<< "${size#default}"
        for lever in "${parts[@]}"; do
          case $lever in
            "") continue ;;
            r*) levers+=(--reuse "${lever#r}") ;;
            ef21m) levers+=(--feedback ef21 --local-momentum 0.9) ;;
            d*) levers+=(--density "${lever#d}") ;;
            lr*) levers+=(--lr "${lever#lr}") ;;
            *) echo "unknown gs lever $lever in $size" >&2; exit 2 ;;
          esac
          name=$name-$lever
        done
        out=$DIR/P$P/s$seed/$name
        execute "P$P-s$seed-$name" "$out/summary.json" \
          .venv/bin/gssgd train --method gs "${base[@]}" --density 0.001 "${levers[@]}" \
          --out "$out"
        continue
      fi
      IFS=: read -r c mm half pf nowu noguard <<< "$size"
      name=gs-c$c-m$mm${half:+-h}${pf:+-pf$pf}${nowu:+-nowu}${noguard:+-noguard}
      out=$DIR/P$P/s$seed/$name
      execute "P$P-s$seed-$name" "$out/summary.json" \
        .venv/bin/gssgd train --method gs "${base[@]}" --density 0.001 --allreduce backend \
        --cols $((c * K)) --candidates "$mm" ${half:+--table-dtype float16} \
        ${pf:+--prefilter "$pf"} ${nowu:+--warmup-steps 0} ${noguard:+--guard off} --out "$out"
    done
  done
done
