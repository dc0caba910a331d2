"""Summarise the collapse guard's audits: is its bar (recall 0.1) right at many workers?

    RUNS_DIR=runs/guard-calibration METHODS=" " \\
        GS_SIZES="default 8:4::0 8:4::0::g 2:2::0" bash scripts/frontier_study.sh "64 16" 0
    .venv/bin/python scripts/guard_report.py [RUNS_DIR] [OUT_DIR]

Reads RUNS_DIR/P<P>/s<seed>/<name>/{summary.json,metrics.jsonl,config.json} (default
runs/guard-calibration) and writes OUT_DIR (default docs/results/guard): summary.json and
summary.md, one row per run: its sketch (columns as a multiple of k, candidates m, the
pre-filter), the recall of every audit (``audited_recall`` in metrics.jsonl, with the
aggregation step), whether the guard grew the sketch, the final accuracy and the
busiest rank's message after the warm-up (frontier_report's ``steady_bytes``). A run with ``--guard off`` has no audits; it
shows what the same sketch does when nothing watches it.

The guard calls a sketch collapsed below :data:`BAR` (``CollapseGuard.min_recall``). The
bar is right at a P when every run that trains (within 0.5 point of the default sketch's
accuracy) audits above it, and every run that does not audits below it.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from frontier_report import steady_bytes  # this script's folder, scripts/

from gssgd.aggregators.guard import CollapseGuard
from gssgd.train.metrics import read_run

#: The guard's bar, as the package ships it.
BAR = CollapseGuard().min_recall
#: The recall in the message of a run the guard stopped.
STOP = re.compile(r"delivered ([0-9.]+)% of the mass")


def _row(run: Path, workers: int) -> dict[str, Any] | None:
    got = read_run(run)
    if got is None:
        return None
    summary, lines = got
    cfg = json.loads((run / "config.json").read_text())
    steady = steady_bytes(summary, lines)
    audits = [(r["step"], r["audited_recall"]) for r in lines
              if r.get("audited_recall") is not None]
    stopped = STOP.search(summary.get("message") or "")
    if summary["status"] != "completed" and stopped:  # the audit that stopped the run
        audits.append((int(summary["steps"]), float(stopped.group(1)) / 100))
    return {
        "P": workers, "name": run.name, "status": summary["status"],
        "accuracy": summary.get("final_test_accuracy"), "steps": summary.get("steps"),
        "cols": cfg.get("cols"), "candidates": cfg.get("candidates"),
        "prefilter": cfg.get("prefilter"), "guard": cfg.get("guard") or "grow",
        "audits": audits, "grown": any(r < BAR for _, r in audits),
        "message_bytes": statistics.median(steady) if steady else None,
    }


def collect(root: Path) -> list[dict[str, Any]]:
    rows = []
    for p_dir in sorted(root.glob("P*"), key=lambda p: int(p.name[1:])):
        for run in sorted(p_dir.glob("s*/*")):
            row = _row(run, int(p_dir.name[1:]))
            if row is not None:
                rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [f"The guard's bar: recall {BAR:.0%}. Audits: the metrics row of the audited step, "
           "and the recall it found; grown: an audit below the bar (the guard then doubled "
           "the columns and candidates). Message: the busiest rank's median step after the "
           "warm-up.", "",
           "| P | run | cols | m | pre-filter | guard | audits | grown | accuracy | message |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        audits = ", ".join(f"{s}: {x:.1%}" for s, x in r["audits"]) or "none"
        acc = f"{r['accuracy']:.2%}" if r["accuracy"] is not None else ""
        if r["status"] != "completed":
            acc = f"{r['status']} at step {r['steps']} (last evaluation {acc})"
        msg = f"{r['message_bytes']:,.0f} B" if r["message_bytes"] else ""
        shape = [("default" if r[key] is None else r[key])
                 for key in ("cols", "candidates", "prefilter")]
        out.append(f"| {r['P']} | {r['name']} | {' | '.join(map(str, shape))} | {r['guard']} | {audits} | "
                   f"{'yes' if r['grown'] else 'no'} | {acc} | {msg} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    root = Path(argv[1] if len(argv) > 1 else "runs/guard-calibration")
    out = Path(argv[2] if len(argv) > 2 else "docs/results/guard")
    rows = collect(root)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"bar": BAR, "runs": rows}, indent=1) + "\n")
    text = markdown(rows)
    (out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv)
