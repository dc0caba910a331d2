# Shared by the study scripts (studies/*/run.sh): source it from the repository root
# after setting DIR.
#
#   cd "$(dirname "$0")/../.." && DIR=runs/mystudy
#   source studies/_lib/study_run.sh
#   execute NAME DONE_FILE COMMAND...
#
# Makes $DIR/logs and its status.tsv (one row per command run: name, exit status, seconds,
# command). `execute` runs COMMAND unless DONE_FILE exists (so a study script can be rerun
# and picks up where it stopped) or another invocation is running it (a claim directory
# beside DONE_FILE's, made atomically), with its output in $DIR/logs/NAME.log; a failure is
# printed with the log's last lines and does not stop the study.
mkdir -p "$DIR/logs"
STATUS=$DIR/logs/status.tsv
[ -f "$STATUS" ] || printf 'name\texit\tseconds\tcommand\n' > "$STATUS"

execute() {  # execute NAME DONE_FILE COMMAND...
    local name=$1 done=$2; shift 2
    [ -f "$done" ] && { echo "skip  $name"; return 0; }
    local claim; claim="$(dirname "$done").claim"  # beside the run's directory
    mkdir -p "$(dirname "$claim")"
    mkdir "$claim" 2> /dev/null || { echo "busy  $name"; return 0; }
    echo "run   $name: $*"
    local t0=$SECONDS
    "$@" > "$DIR/logs/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" >> "$STATUS"
    rmdir "$claim"
    [ $rc -ne 0 ] && { echo "FAIL  $name (exit $rc)"; tail -3 "$DIR/logs/$name.log"; }
    return 0
}

# study_train NAME ARGS...: one `gssgd train` run of the simulated grids
# (studies/fair_frontier/run.sh, studies/local_steps/run.sh) into $DIR/P$P/s$seed/NAME, with
# DATASET, STEPS, P, seed and batch (samples a worker) set, MODEL (default cnn) and
# EVAL_EVERY (default 100) optional; skipped once done.
study_train() {
    local name=$1; shift
    execute "P$P-s$seed-$name" "$DIR/P$P/s$seed/$name/summary.json" \
        .venv/bin/gssgd train --simulate --dataset "$DATASET" --model "${MODEL:-cnn}" \
        --steps "$STEPS" --eval-every "${EVAL_EVERY:-100}" --workers "$P" \
        --global-batch $((P * batch)) --seed "$seed" \
        --no-progress --overwrite "$@" --out "$DIR/P$P/s$seed/$name"
}
