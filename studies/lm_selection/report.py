"""Print the table of the 600-step lever runs on the character LSTM (docs/study.md, "Levers
for gs on the language model at 16 workers"): each run's final test loss, its gap to dense
of the same seed, and the busiest link's bytes a step.

    .venv/bin/python studies/lm_selection/report.py [RUNS_DIR]      # default runs/lm-levers

Reads every finished run under RUNS_DIR (one directory a run, as the record's commands
name them: ``topk``, ``gs-d0.01``, ``dense-s1``, ...). Dense of a seed is the run of that
seed whose method is dense; bytes a step are the busiest link's, in its busier direction:
the mean over the whole run (the density warm-up included) and the median after the
warm-up (:func:`steady_bytes`).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from gssgd.train.config import TrainConfig  # noqa: E402
from studies._lib.report import busier_totals, markdown_table, read_runs, steady_bytes  # noqa: E402


def table(root: Path) -> str:
    """The markdown table of every finished run under ``root``, by seed, then density."""
    runs = read_runs(root)
    config = {r.name: TrainConfig.from_saved(r.summary["config"]) for r in runs}
    dense = {config[r.name].seed: r.summary["final_test_loss"]
             for r in runs if r.summary["method"] == "dense"}  # fmt: skip
    rows = []
    order = sorted(runs, key=lambda r: (config[r.name].seed, config[r.name].option("density") or 0,
                                        r.name))  # fmt: skip
    for r in order:
        loss, seed = r.summary["final_test_loss"], config[r.name].seed
        base = None if r.summary["method"] == "dense" else dense.get(seed)
        steady = steady_bytes(r.summary, r.records)
        rows.append([
            r.name, str(seed), str(config[r.name].option("density") or "–"), f"{loss:.4f}",
            "–" if base is None else f"{100 * (loss / base - 1):+.1f} %",
            f"{busier_totals(r.records)[-1] / len(r.records):,.0f}",
            f"{statistics.median(steady):,.0f}" if steady else "–",
        ])  # fmt: skip
    return markdown_table(["run", "seed", "density", "test loss", "vs dense",
                           "B / step, whole run", "B / step after the warm-up (median)"],
                          rows)  # fmt: skip


if __name__ == "__main__":
    print(table(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/lm-levers")))
