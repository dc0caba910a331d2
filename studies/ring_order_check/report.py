"""The ring-order check's table: gs's final test accuracy per seed before and after the
simulated ring's order change, their means and the difference (results/summary.{json,md}).

    .venv/bin/python studies/ring_order_check/report.py [RUNS_DIR]   # runs/ring-order/runs
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def summarize(runs: Path) -> dict:
    """Final test accuracy by tree and seed, and each tree's mean and sample deviation."""
    acc = {tree: {str(seed): json.loads((runs / f"{tree}-s{seed}" / "summary.json")
                       .read_text())["final_test_accuracy"] for seed in (0, 1, 2)}
           for tree in ("before", "after")}
    return {tree: {"by_seed": values,
                   "mean": statistics.mean(values.values()),
                   "stdev": statistics.stdev(values.values())}
            for tree, values in acc.items()}


def markdown(summary: dict) -> str:
    rows = ["| seed | before (rank order) | after (gloo's ring order) |", "|---|---|---|"]
    for seed in summary["before"]["by_seed"]:
        rows.append(f"| {seed} | {summary['before']['by_seed'][seed]:.2%} | "
                    f"{summary['after']['by_seed'][seed]:.2%} |")
    rows.append(f"| mean ± sd | {summary['before']['mean']:.2%} ± "
                f"{summary['before']['stdev']:.2%} | {summary['after']['mean']:.2%} ± "
                f"{summary['after']['stdev']:.2%} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    runs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/ring-order/runs")
    summary = summarize(runs)
    (HERE / "results" / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (HERE / "results" / "summary.md").write_text(markdown(summary))


if __name__ == "__main__":
    main()
