#!/usr/bin/env bash
# The streaming regression check: streamed gs's step against blocking gs's, on emulated
# 100 Mbit/s links (root: network namespaces), 4 workers, Shakespeare's character LSTM.
#
#   bash tools/overlap_check.sh               # 3 runs a mode, interleaved; one result line
#   REPEAT=5 bash tools/overlap_check.sh
#   # another commit: unpack it beside, run its copy of this script with this venv
#   git archive abc123 | tar -x -C /tmp/wt-abc123 && mkdir -p /tmp/wt-abc123/tools && cp tools/overlap_check.sh /tmp/wt-abc123/tools/
#   PYTHON=$PWD/.venv/bin/python HISTORY=$PWD/studies/overlap/results/check_history.tsv \
#     LABEL=abc123 bash /tmp/wt-abc123/tools/overlap_check.sh
#
# Each run is `gssgd bench train --methods gs --overlap MODE --link 100mbit --workers 4
# --steps 30 --eval-every 30 --dataset shakespeare` (the command the figures in
# docs/benchmarks.md, "Streaming gs: the regression check", were taken with), in three modes:
# stream, none (blocking gs at its defaults) and ring (blocking gs with --allreduce backend,
# the all-reduce streaming uses: stream/ring is what overlapping itself buys). The modes
# alternate, so drift on a noisy machine hits all alike; the line printed (and appended to
# HISTORY) holds the date, the commit, the median milliseconds per step of each mode and the
# ratios. The streamed step should be at most 0.75x the blocking one. Raw runs go to $OUT
# (git-ignored). RING=0 skips the ring mode (commits before streaming's exact round went by
# the ring compare only stream and none).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}  # run from the checkout: its gssgd comes first on the path
OUT=${OUT:-runs/overlap-check}
REPEAT=${REPEAT:-3}
HISTORY=${HISTORY:-studies/overlap/results/check_history.tsv}
LABEL=${LABEL:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ "$(id -u)" = 0 ] || { echo "overlap_check: needs root (network namespaces)"; exit 2; }
rm -rf "$OUT" && mkdir -p "$OUT" "$(dirname "$HISTORY")"
MODES="stream none"
[ "${RING:-1}" = 0 ] || MODES="$MODES ring"
for i in $(seq 1 "$REPEAT"); do
  for mode in $MODES; do
    flags=(--overlap "$mode")
    [ "$mode" = ring ] && flags=(--overlap none --allreduce backend)
    "$PYTHON" -m gssgd.cli.main bench train --methods gs "${flags[@]}" --link 100mbit --workers 4 \
      --steps 30 --eval-every 30 --dataset shakespeare \
      --out "$OUT/$mode-$i" > "$OUT/$mode-$i.log" 2>&1 \
      || { echo "overlap_check: $mode run $i failed:"; tail -5 "$OUT/$mode-$i.log"; exit 1; }
  done
done
[ -f "$HISTORY" ] || printf 'date\tcommit\tstream_ms\tnone_ms\tratio\tring_ms\tstream_vs_ring\truns\n' > "$HISTORY"
"$PYTHON" - "$OUT" "$REPEAT" "$LABEL" "$HISTORY" <<'PY'
import datetime, json, statistics, sys
from pathlib import Path
out, repeat, label, history = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
modes = [m for m in ("stream", "none", "ring") if (out / f"{m}-1/results.json").exists()]
ms = {m: [1000 * json.loads((out / f"{m}-{i}/results.json").read_text())["gs"]["seconds_per_step"]
          for i in range(1, repeat + 1)] for m in modes}
med = {m: statistics.median(x) for m, x in ms.items()}
stream, none, ring = med["stream"], med["none"], med.get("ring")
ring_cells = f"{ring:.1f}\t{stream / ring:.3f}" if ring else "-\t-"
runs = "; ".join(f"{m} {', '.join(f'{x:.1f}' for x in ms[m])}" for m in modes)
line = (f"{datetime.date.today()}\t{label}\t{stream:.1f}\t{none:.1f}\t{stream / none:.3f}\t"
        f"{ring_cells}\t{runs}")
with open(history, "a") as f:
    f.write(line + "\n")
print(f"streamed {stream:.1f} ms, blocking {none:.1f} ms per step: {stream / none:.2f}x "
      f"(medians of {repeat}; target <= 0.75x)")
if ring:
    print(f"blocking on the ring {ring:.1f} ms: streamed/ring {stream / ring:.2f}x "
          "(what overlapping backward buys)")
print(line)
PY
