"""Summarise the collapse guard's audits: is its bar (recall 0.1) right at many workers?

    RUNS_DIR=runs/guard-calibration METHODS=" " \\
        GS_SIZES="default 8:4::0 8:4::0::g 2:2::0" bash studies/frontier/run.sh "64 16" 0
    .venv/bin/python studies/guard/report.py [RUNS_DIR] [OUT_DIR]

Reads RUNS_DIR/P<P>/s<seed>/<name>/{summary.json,metrics.jsonl,config.json} (default
runs/guard-calibration) and writes OUT_DIR (default studies/guard/results): summary.json and
summary.md, one row per run: its sketch (columns as a multiple of k, candidates m, the
pre-filter), the recall of every audit (``audited_recall`` in metrics.jsonl, with the
aggregation step), whether the guard grew the sketch, the final accuracy and the
busiest rank's message after the warm-up (the report toolkit's ``steady_bytes``). A run
with ``--guard off`` has no audits; it shows what the same sketch does when nothing watches it.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from gssgd.aggregators.gs import CollapseGuard  # noqa: E402
from gssgd.train.config import TrainConfig  # noqa: E402
from studies._lib.report import (  # noqa: E402
    Run,
    markdown_table,
    read_runs,
    steady_bytes,
    worker_dirs,
    write_summary,
)

#: The guard's bar, as the package ships it.
BAR = CollapseGuard().min_recall
#: The recall in the message of a run the guard stopped.
STOP = re.compile(r"delivered ([0-9.]+)% of the mass")


def _row(run: Run, workers: int) -> dict[str, Any]:
    """One run's sketch, audits (with the one that stopped it), and message bytes."""
    summary, lines = run.summary, run.records
    cfg = TrainConfig.from_saved(json.loads((run.path / "config.json").read_text()))
    steady = steady_bytes(summary, lines)
    audits = [
        (r["step"], r["audited_recall"]) for r in lines if r.get("audited_recall") is not None
    ]
    stopped = STOP.search(summary.get("message") or "")
    if summary["status"] != "completed" and stopped:  # the audit that stopped the run
        audits.append((int(summary["steps"]), float(stopped.group(1)) / 100))
    return {
        "P": workers,
        "name": run.name,
        "status": summary["status"],
        "accuracy": summary.get("final_test_accuracy"),
        "steps": summary.get("steps"),
        "cols": cfg.option("cols"),
        "candidates": cfg.option("candidates"),
        "prefilter": cfg.option("prefilter"),
        "guard": cfg.option("guard") or "grow",
        "audits": audits,
        "grown": any(r < BAR for _, r in audits),
        "message_bytes": statistics.median(steady) if steady else None,
    }


def collect(root: Path) -> list[dict[str, Any]]:
    """Every finished run's row, by P, then by seed and name."""
    return [
        _row(run, workers)
        for workers, p_dir in worker_dirs(root)
        for run in read_runs(p_dir, "s*/*")
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of every run, under the line that explains its columns."""
    cells = []
    for r in rows:
        audits = ", ".join(f"{s}: {x:.1%}" for s, x in r["audits"]) or "none"
        acc = f"{r['accuracy']:.2%}" if r["accuracy"] is not None else ""
        if r["status"] != "completed":
            acc = f"{r['status']} at step {r['steps']} (last evaluation {acc})"
        msg = f"{r['message_bytes']:,.0f} B" if r["message_bytes"] else ""
        shape = " | ".join(
            str("default" if r[key] is None else r[key])
            for key in ("cols", "candidates", "prefilter")
        )
        grown = "yes" if r["grown"] else "no"
        cells.append(
            f"{r['P']} | {r['name']} | {shape} | {r['guard']} | {audits} | {grown} | {acc} | {msg}"
        )
    head = "P | run | cols | m | pre-filter | guard | audits | grown | accuracy | message"
    return (
        f"The guard's bar: recall {BAR:.0%}. Audits: the metrics row of the audited step, and the "
        "recall it found; grown: an audit below the bar (the guard then doubled the columns and "
        "candidates). Message: the busiest rank's median step after the warm-up.\n\n"
        + markdown_table(head, cells)
        + "\n"
    )


def main(argv: list[str]) -> None:
    root = Path(argv[1] if len(argv) > 1 else "runs/guard-calibration")
    out = Path(argv[2] if len(argv) > 2 else "studies/guard/results")
    rows = collect(root)
    text = markdown(rows)
    write_summary(out, {"bar": BAR, "runs": rows}, text)
    print(text)


if __name__ == "__main__":
    main(sys.argv)
