#!/usr/bin/env bash
# The convergence study (docs/study.md): every run of it, one after another.
#
#   studies/convergence/run.sh                                 # the runs missing, in runs/study
#   .venv/bin/python studies/convergence/report.py --clean-checkpoints  # studies/convergence/results/ and docs/study.md
#   STUDY_DIR=/tmp/s studies/convergence/run.sh                  # raw runs elsewhere; then
#   .venv/bin/python studies/convergence/report.py --raw /tmp/s
#
# Raw output stays out of git, under $STUDY_DIR (default runs/study, ignored as /runs/):
# $STUDY_DIR/runs/<name>/ holds each run's summary.json, metrics.jsonl, config.json and
# checkpoints; $STUDY_DIR/logs/<name>.log its stdout+stderr (the collapse guard's "growing
# the sketch" warnings land there), $STUDY_DIR/logs/status.tsv one line per run (command,
# exit status, seconds) and $STUDY_DIR/logs/C-lr.txt part C's learning rate. Only the
# report's summaries are committed: studies/convergence/results/results.json, studies/convergence/results/tables.md, the
# plots studies/convergence/results/*.png and the tables spliced into docs/study.md.
#
# Idempotent: a run whose $STUDY_DIR/runs/<name>/summary.json exists is skipped, so the
# script can be stopped and started again. Runs are strictly sequential (the development
# machine has 2 cores shared with other jobs). A run that fails is logged and the study
# goes on.
#
# Environment knobs (the values docs/study.md reports were run with the defaults):
#   STEPS_A=400  STEPS_B=300  STEPS_C=200  SKIP_OPTIONAL=0 (1: skip part A's local
#   momentum at density 0.01, the lowest-priority group)
set -u
cd "$(dirname "$0")/../.."

GSSGD=${GSSGD:-.venv/bin/gssgd}
PY=${PY:-.venv/bin/python}
STUDY_DIR=${STUDY_DIR:-runs/study}
RUNS=$STUDY_DIR/runs
LOGS=$STUDY_DIR/logs
STEPS_A=${STEPS_A:-400}
STEPS_B=${STEPS_B:-300}
STEPS_C=${STEPS_C:-200}
SKIP_OPTIONAL=${SKIP_OPTIONAL:-0}
mkdir -p "$RUNS" "$LOGS"
STATUS=$LOGS/status.tsv
[ -f "$STATUS" ] || printf 'name\texit\tseconds\tcommand\n' > "$STATUS"

# run NAME ARGS... : one `gssgd train` into $RUNS/NAME unless it already finished.
run() {
    local name=$1; shift
    local out=$RUNS/$name
    if [ -f "$out/summary.json" ]; then
        echo "skip  $name (summary.json exists)"
        return 0
    fi
    local cmd=("$GSSGD" train --seed 0 "$@" --no-progress --out "$out" --overwrite)  # a later --seed wins
    echo "run   $name: ${cmd[*]}"
    local t0=$SECONDS
    "${cmd[@]}" > "$LOGS/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "${cmd[*]}" >> "$STATUS"
    if [ $rc -ne 0 ]; then
        echo "FAIL  $name (exit $rc): see $LOGS/$name.log"; tail -3 "$LOGS/$name.log"
    fi
    return 0
}

# The dense reference of every part is DDP's built-in all-reduce (`ddp-allreduce`; runs made
# before the method names were split recorded it as `dense`, and the report shows it as dense).
MNIST=(--dataset mnist --model cnn --batch-size 32 --lr 0.05)
COMMON=(--momentum 0.9)                          # optimizer momentum after aggregation
LOCAL=(--momentum 0 --local-momentum 0.9)        # local momentum with momentum stopping

# k for MNIST CNN (d = 80,602): density 0.01 -> k = 806, 0.001 -> k = 81.
K3=81; C10K=$((10 * K3)); C40K=$((40 * K3))

# ---- A. MNIST CNN, P = 4 -------------------------------------------------------------
A=("${MNIST[@]}" --workers 4 --steps "$STEPS_A" --eval-every 100)
# A1 common configuration, library sketch defaults
run A-common-dense "${A[@]}" "${COMMON[@]}" --method ddp-allreduce
for dens in 0.01 0.001; do
    for m in topk gtopk sketched gs; do
        run "A-common-$m-$dens" "${A[@]}" "${COMMON[@]}" --method $m --density $dens
    done
done
# A2 local momentum placement, density 0.001
for m in topk gtopk sketched gs; do
    run "A-local-$m-0.001" "${A[@]}" "${LOCAL[@]}" --method $m --density 0.001
done
# A3 Sketched-SGD's published configuration: 5 rows x 10·k columns, m = 4, local momentum 0.9
for m in sketched gs; do
    run "A-published-$m-0.001" "${A[@]}" "${LOCAL[@]}" --method $m --density 0.001 \
        --rows 5 --cols $C10K --candidates 4
done

# ---- D. gs sketch-size sweep, MNIST, P = 4, density 0.001, common configuration -------
# Today's default (1 row x 40·k columns, m = 32) is run A-common-gs-0.001; the first pass's
# default (5 rows x 10·k columns, m = 16) is run A-common-gs5row-0.001.
for shape in "5 $C10K 4" "3 $C10K 16" "1 $C40K 16" "5 $C40K 16" "1 $C10K 16"; do
    set -- $shape
    run "D-gs-r$1-c$2-m$3" "${A[@]}" "${COMMON[@]}" --method gs --density 0.001 \
        --rows "$1" --cols "$2" --candidates "$3"
done

# D2. the throughput levers of docs/benchmarks.md, on the default sketch: do they train alike?
run D-gs-half "${A[@]}" "${COMMON[@]}" --method gs --density 0.001 --table-dtype float16
run D-gs-backend "${A[@]}" "${COMMON[@]}" --method gs --density 0.001 --allreduce backend
run D-gs-estimate "${A[@]}" "${COMMON[@]}" --method gs --density 0.001 --no-exact

# ---- B. MNIST CNN, P = 8, density 0.001, common configuration ------------------------
B=("${MNIST[@]}" --workers 8 --steps "$STEPS_B" --eval-every 100)
for m in topk gtopk sketched gs; do
    run "B-p8-$m-0.001" "${B[@]}" "${COMMON[@]}" --method $m --density 0.001
done

# ---- C. Shakespeare character LSTM, P = 4, density 0.001, common configuration --------
C=(--dataset shakespeare --model lm --batch-size 32 --seq-len 64 --workers 4
   --steps "$STEPS_C" --eval-every 50 --momentum 0.9)
# learning rate: dense at three rates, the lowest final test loss is used for every method
for lr in 0.5 1.0 2.0; do
    run "C-lr-dense-$lr" "${C[@]}" --method ddp-allreduce --lr $lr
done
LR_C=$("$PY" - "$RUNS" <<'EOF'
import json, sys, pathlib
best = None
for lr in ("0.5", "1.0", "2.0"):
    p = pathlib.Path(sys.argv[1]) / f"C-lr-dense-{lr}" / "summary.json"
    if p.exists():
        loss = json.loads(p.read_text()).get("final_test_loss")
        if loss is not None and loss == loss and (best is None or loss < best[0]):
            best = (loss, lr)
print(best[1] if best else "1.0")
EOF
)
echo "part C learning rate: $LR_C"
echo "$LR_C" > "$LOGS/C-lr.txt"
for m in topk gtopk sketched gs; do
    run "C-$m-0.001" "${C[@]}" --lr "$LR_C" --method $m --density 0.001
done

# ---- B2. MNIST CNN, P = 8: dense, and density 0.01 ---------------------------------
run B-p8-dense "${B[@]}" "${COMMON[@]}" --method ddp-allreduce
for m in topk gtopk sketched gs; do
    run "B-p8-$m-0.01" "${B[@]}" "${COMMON[@]}" --method $m --density 0.01
done

# ---- C2. Shakespeare, P = 4, density 0.01 -----------------------------------------------
for m in topk gtopk sketched gs; do
    run "C-$m-0.01" "${C[@]}" --lr "$LR_C" --method $m --density 0.01
done

# ---- E. Shakespeare, P = 8, density 0.001 (same rate as part C) -----------------------
E=(--dataset shakespeare --model lm --batch-size 32 --seq-len 64 --workers 8
   --steps "$STEPS_C" --eval-every 50 --momentum 0.9 --lr "$LR_C")
run E-p8-dense "${E[@]}" --method ddp-allreduce
for m in topk gtopk sketched gs; do
    run "E-p8-$m-0.001" "${E[@]}" --method $m --density 0.001
done

# ---- A (optional). local momentum placement at density 0.01 --------------------------
if [ "$SKIP_OPTIONAL" != 1 ]; then
    for m in topk gtopk sketched gs; do
        run "A-local-$m-0.01" "${A[@]}" "${LOCAL[@]}" --method $m --density 0.01
    done
fi

# ---- S. seeds 1 and 2 of part A's headline cell (density 0.001, common configuration) ------
# One seed leaves differences of several points unresolved: these say how far runs scatter.
for seed in 1 2; do
    for m in topk gtopk sketched gs; do
        run "S-$m-0.001-seed$seed" "${A[@]}" "${COMMON[@]}" --method $m --density 0.001 \
            --seed "$seed"
    done
done

echo "all runs done; report: $PY studies/convergence/report.py --raw $STUDY_DIR --clean-checkpoints"
