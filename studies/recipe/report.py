"""Summarise the recipe study's runs (studies/recipe/run.sh) into studies/recipe/results/.

    .venv/bin/python studies/recipe/report.py [--raw runs/recipe] [--out studies/recipe/results]
        [--p8 DIR ...]

Reads every ``RAW/runs/<name>/summary.json`` and ``metrics.jsonl`` and writes
``OUT/recipe.json`` (one record per run) and ``OUT/recipe.md`` (the tables that
docs/study.md shows). Run names are ``[lm-]METHOD-m<momentum>-lr<lr>[-wu<steps>]-d<density>-s<seed>``
(``lm0.9`` for local momentum; ``wu100from0.01``: a warm-up that starts at density 0.01
rather than 0.25; dense runs have no density; ``lm-``: the Shakespeare LSTM,
otherwise the MNIST CNN). The ``--p8`` directories are ``gssgd compare --workers 8`` outputs
(one subdirectory per method), one per seed and density; by default ``runs/p8`` (seed 0 at
density 0.001) and every ``RAW/runs/p8-*``.

Per cell (task, method, recipe, density) the tables give the mean and spread of the final
metric over seeds (MNIST: test accuracy, higher is better; Shakespeare: test loss in nats per
character, lower is better), the gap to dense's mean, the bytes each worker sent per step, and
the bytes it had sent when it first came close to dense's final metric (MNIST: within 0.5
point of its accuracy; Shakespeare: within 3 % of its loss) at an evaluation. Dense's
reference is its best recipe by mean. A run the collapse guard stopped counts with the metric
of its last evaluation (what its user is left with), and the seeds column says how many stopped.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for studies._lib
from gssgd.train.config import TrainConfig  # noqa: E402
from studies._lib.report import (  # noqa: E402
    ACCURACY,
    LOSS,
    Metric,
    first_reaching,
    group,
    markdown_table,
    read_metrics,
    read_runs,
    seed_band,
    write_summary,
)

NAME = re.compile(
    r"^(?:(?P<task>lm)-)?(?P<method>[a-z]+)-(?P<mom>l?m[0-9.]+)-lr(?P<lr>[0-9.]+)"
    r"(?:-wu(?P<wu>\d+(?:from[0-9.]+)?))?(?:-d(?P<density>[0-9.]+))?-s(?P<seed>\d+)$"
)


@dataclass(frozen=True)
class Task:
    """What a task's table measures (its :class:`Metric`: accuracy within 0.5 point or loss
    within 3 % of dense is "close to dense") and how the table shows it."""

    title: str
    metric: Metric
    label: str
    close_label: str
    fmt: Callable[[float], str]
    gap: Callable[[float, float], str]  # gap(mean, dense_mean)

    @property
    def key(self) -> str:
        """The metrics.jsonl field: ``test_accuracy`` or ``test_loss``."""
        return f"test_{self.metric.key}"


MNIST = Task(
    "MNIST CNN, P = 4, 400 steps",
    ACCURACY,
    "test acc (mean)",
    "bytes to dense - 0.5 pt",
    lambda v: f"{100 * v:.2f}",
    lambda m, ref: f"{100 * (m - ref):+.2f} pt",
)
SHAKESPEARE = Task(
    "Shakespeare LSTM, P = 4, 200 steps",
    LOSS,
    "test loss (mean)",
    "bytes to dense + 3 %",
    lambda v: f"{v:.3f}",
    lambda m, ref: f"{100 * (m / ref - 1):+.1f} %",
)
TASKS = {"mnist": MNIST, "lm": SHAKESPEARE}


def _record(
    metrics: list[dict[str, Any]],
    name: str,
    task: str,
    method: str,
    recipe: str,
    density: float | None,
    seed: int,
    result: dict[str, Any],
) -> dict[str, Any]:
    """One run's record from its result (a summary.json, or a compare results.json entry:
    the same keys) and its metrics.jsonl records (each evaluation's step, metric and bytes
    sent so far)."""
    metric = TASKS["lm" if task == "lm" else "mnist"].key
    return {
        "name": name,
        "task": task,
        "method": method,
        "recipe": recipe,
        "density": density,
        "seed": seed,
        "status": result["status"],
        "final": result[f"final_{metric}"],
        "bytes_sent_per_step": result["bytes_sent_per_step"],
        "bytes_sent_total": result["bytes_sent_total"],
        "evals": [(r["step"], r[metric], r["bytes_sent_total"]) for r in metrics if metric in r],
    }  # fmt: skip


def load(raw: Path) -> list[dict[str, Any]]:
    """One record per finished run of ``RAW/runs``."""
    records = []
    for run in read_runs(raw / "runs"):
        m = NAME.match(run.name)
        if not m:
            continue
        recipe = m["mom"] + f"-lr{m['lr']}" + (f"-wu{m['wu']}" if m["wu"] else "")
        density = float(m["density"]) if m["density"] else None
        records.append(_record(run.records, run.name, m["task"] or "mnist", m["method"], recipe,
                               density, int(m["seed"]), run.summary))  # fmt: skip
    return records


def load_compare(dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """One record per method and seed of ``gssgd compare`` outputs (the P = 8 part); the
    recipe's warm-up and the density come from each run's config.json."""
    records = []
    for out in dirs:
        settings_path = out / "settings.json"
        if not settings_path.is_file():
            continue
        seed = json.loads(settings_path.read_text())["seed"]
        for method, result in json.loads((out / "results.json").read_text()).items():
            config = TrainConfig.from_saved(json.loads((out / method / "config.json").read_text()))
            warmup = config.option("warmup_steps") or 0
            recipe = f"m{result['momentum']:g}-lr{result['lr']:g}" + (
                f"-wu{warmup}" if warmup else ""
            )
            density = None if method == "dense" else config.option("density")
            metrics = read_metrics(out / method / "metrics.jsonl")
            records.append(_record(metrics, f"{out.name}/{method}", "p8", method, recipe,
                                   density, seed, result))  # fmt: skip
    return records


def _dense_reference(
    records: list[dict[str, Any]], task: Task
) -> tuple[str, float, float, int] | None:
    """(recipe, mean final metric, mean bytes per step, seeds) of dense's best recipe: the
    one with the most seeds (a one-seed recipe is not a reference), then the best mean."""
    by_recipe = group(
        (r for r in records if r["method"] == "dense" and r["final"] is not None),
        lambda r: r["recipe"],
    )
    if not by_recipe:
        return None
    sign = 1 if task.metric.higher_is_better else -1

    def score(item: tuple[str, list[dict[str, Any]]]) -> tuple[int, float]:
        return len(item[1]), sign * statistics.mean(r["final"] for r in item[1])

    recipe, runs = max(by_recipe.items(), key=score)
    return (
        recipe,
        statistics.mean(r["final"] for r in runs),
        statistics.mean(r["bytes_sent_per_step"] for r in runs),
        len(runs),
    )


def table(records: list[dict[str, Any]], task: Task) -> str:
    """The markdown table of every (method, recipe, density) cell of one task."""
    ref = _dense_reference(records, task)
    cells = group(records, lambda r: (r["density"] or 1.0, r["method"], r["recipe"]))
    rows = []
    for (density, method, recipe), runs in sorted(
        cells.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2])
    ):
        failed = [r for r in runs if r["final"] is None]
        if failed:  # the rest of the row stays blank
            rows.append(
                f"{density:g} | {method} | {recipe} | {len(runs)} | "
                f"{len(failed)} run(s) {failed[0]['status']} | | | | |"
            )
            continue
        stopped = [r for r in runs if r["status"] != "completed"]
        seeds = str(len(runs)) + (f" ({len(stopped)} {stopped[0]['status']})" if stopped else "")
        band = seed_band([r["final"] for r in runs])
        per_step = statistics.mean(r["bytes_sent_per_step"] for r in runs)
        gap = fewer = reach = ""
        if ref is not None:
            gap = task.gap(band.mean, ref[1])
            fewer = f"{ref[2] / per_step:,.0f}x"
            got = [first_reaching(r["evals"], task.metric, ref[1]) for r in runs]
            reach = ", ".join("not reached" if g is None else f"{g[2] / 1e6:.1f} MB" for g in got)
        rows.append(
            f"{density:g} | {method} | {recipe} | {seeds} | {task.fmt(band.mean)} | "
            f"{task.fmt(band.spread)} | {gap} | {per_step:,.0f} | {fewer} | {reach}"
        )
    head = (
        f"density | method | recipe | seeds | {task.label} | spread | vs dense | "
        f"bytes/worker/step | x fewer than dense | {task.close_label}"
    )
    lines = [markdown_table(head, rows)]
    if ref is not None:
        lines.append("")
        lines.append(f"Dense reference: {task.fmt(ref[1])} (mean of {ref[3]} seeds, {ref[0]}).")
    return "\n".join(lines)


def report(records: list[dict[str, Any]]) -> str:
    """Every task's table under its title."""
    parts = []
    for key, task in (("mnist", MNIST), ("lm", SHAKESPEARE), ("p8", MNIST)):
        rows = [r for r in records if r["task"] == key]
        if rows:
            title = task.title if key != "p8" else "MNIST CNN, P = 8, 400 steps (gssgd compare)"
            parts.append(f"### {title}\n\n{table(rows, task)}")
    return "\n\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, default=Path("runs/recipe"))
    ap.add_argument("--out", type=Path, default=Path("studies/recipe/results"))
    ap.add_argument("--p8", type=Path, nargs="*", default=None)
    args = ap.parse_args()
    if args.p8 is None:
        args.p8 = [Path("runs/p8"), *sorted((args.raw / "runs").glob("p8-*"))]
    records = load(args.raw) + load_compare(args.p8)
    text = report(records)
    write_summary(args.out, records, text + "\n", name="recipe")
    print(text)


if __name__ == "__main__":
    main()
