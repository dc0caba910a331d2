"""``gssgd study SPEC``: search every method with the same budget, re-run each best at
every seed, and write the summary.

The study's directory (``--out``, default ``runs/study-<name>``) holds ``spec.json`` (the
parsed spec: a resumed study must have the same), ``runs/`` (one folder per run:
:mod:`gssgd.study.trials`) and what the summary makes: ``summary.json``, ``summary.md`` and
``curves.png``. Running the same command again on a killed study continues it; on a
finished one it only rewrites the summary from the runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gssgd.study.curves import ACCURACY, LOSS, Metric
from gssgd.study.parallel import check_jobs, run_planned, search_methods
from gssgd.study.report import markdown, plot
from gssgd.study.search import reference_value, rejudge, search_method
from gssgd.study.spec import StudySpec
from gssgd.study.summary import summarise
from gssgd.study.trials import check_spec
from gssgd.train.metrics import write_json
from gssgd.train.progress import counter

__all__ = ["metric_of", "run_study", "runs_cost"]

SPEC_FILE = "spec.json"
LOCK_FILE = ".lock"


def metric_of(spec: StudySpec) -> Metric:
    """The spec's metric with its margin."""
    base = ACCURACY if spec.metric == "accuracy" else LOSS
    return Metric(base.key, base.higher_is_better, spec.margin, spec.window)


def _claim(spec: StudySpec, out: Path) -> None:
    """Write the spec into ``out``, or check that a started study there has the same."""
    out.mkdir(parents=True, exist_ok=True)
    path, mine = out / SPEC_FILE, json.loads(json.dumps(spec.source, sort_keys=True))
    if path.is_file():
        before = json.loads(path.read_text())
        if before != mine:
            raise ValueError(f"{out} holds a study of another spec ({path}); give this spec "
                             "a new --out, or delete that directory to start afresh")
        return
    write_json(path, mine)


def run_study(spec: StudySpec, out: Path, progress: bool = True,
              jobs: int = 1) -> dict[str, Any]:
    """Run (or continue) the study into ``out`` and write its summary.

    Args:
        spec: the study.
        out: its directory.
        progress: show a progress bar over the study's runs.
        jobs: how many runs (a Latin hypercube, grid or random search: every setting is
            known ahead) or methods (TPE) at once, each in a process of its own
            (:mod:`gssgd.study.parallel`). The summary does not depend on it.

    Returns:
        The summary (also in ``out/summary.json``).

    Raises:
        ValueError: a spec whose methods reject a knob, ``out`` holding another study, or
            ``jobs`` below 1.
        RuntimeError: a trial that did not complete.
    """
    check_jobs(jobs)
    check_spec(spec, out / "runs")
    _claim(spec, out)
    with _alone_in(out):
        return _run(spec, out, progress, jobs)


@contextmanager
def _alone_in(out: Path) -> Iterator[None]:
    """Hold ``out/.lock`` while the study runs, so that a second study into the same
    directory is refused instead of training into the same run folders (the lock goes
    with the process, however it ends)."""
    import fcntl

    with open(out / LOCK_FILE, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another gssgd study is running in {out}: wait for it to end, "
                             "or give this one another --out") from None
        yield


def _run(spec: StudySpec, out: Path, progress: bool, jobs: int) -> dict[str, Any]:
    metric, runs = metric_of(spec), out / "runs"
    bar = counter(spec.trials, "study", "run", progress, who="gssgd study")
    counted: set[str] = set()

    def tick(text: str) -> None:  # once per run: a run done ahead is read again later
        bar.set_postfix(run=text)
        if text not in counted:
            counted.add(text)
            bar.update(1)

    ref_row = spec.method(spec.reference)
    run_planned(spec, runs, metric, tick, jobs)  # jobs > 1: the runs known in advance
    found = {ref_row.label: search_method(spec, ref_row, runs, metric, None, tick)}
    dense = reference_value(ref_row.label, list(found[ref_row.label]["seeds"].values()))
    found[ref_row.label] = rejudge(found[ref_row.label], metric, dense)
    others = [row for row in spec.methods if row.label != ref_row.label]
    found.update(search_methods(spec, others, runs, metric, dense, tick, jobs))
    bar.close()
    d = found[ref_row.label]["trials"][0][1].d
    ordered = {row.label: found[row.label] for row in spec.methods}
    summary = summarise(spec, ordered, metric, dense, d)
    write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(markdown(summary))
    curves = {label: [o.curve for o in f["seeds"].values()] for label, f in ordered.items()}
    plot(summary, curves, out / "curves.png")
    return summary


def runs_cost(out: Path) -> tuple[int, float]:
    """The study's runs in ``out`` and their CPU-hours: each run's wall time times its
    processes (one for a simulated world, one per worker for real ones). Measured, so it
    stays out of the summary, which a resumed study must remake byte for byte."""
    seconds, count = 0.0, 0
    for path in sorted((out / "runs").glob("*/*/summary.json")):
        run = json.loads(path.read_text())
        processes = 1 if run.get("simulated") else int(run.get("world_size", 1))
        seconds += float(run.get("seconds_wall", 0.0)) * processes
        count += 1
    return count, seconds / 3600
